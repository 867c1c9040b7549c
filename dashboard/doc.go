// Package dashboard is the operator's console of a node (`meshnode ui`): its pages, a
// snapshot of the mesh as the node sees it, the snapshot's live stream and the operator's
// actions (deploy, undeploy, replay and drop a dead letter), served under /ui/. It reads the
// node through the small Mesh interface and never imports node; ui.go says how a browser
// logs in.
package dashboard
