// Package api holds the types that cross the bus between a module, an operator's client and
// the mesh: requests, replies and the records they carry, and the subjects and verbs that
// address them. It depends on the standard library and manifest only, so a client (the sdk,
// `meshnode`'s client verbs) links no server, and a service that answers with another
// service's data need not import it. What needs more stays with its service: vault.Call
// seals and opens, audit.Call pages, deploy.CheckDeployment checks an artifact's version.
//
// Each file is one service's wire (controller.go the mesh-controller's tools, vault.go the
// vault's, node.go a node's own tools and status, …). A name carries its service where a
// bare one would be ambiguous: SeatRequest, VaultRequest, AuditRecord, NodeStatus.
//
// A type here is the wire: its JSON is what other languages' clients read, so a field is
// renamed or dropped only on purpose (internal/wiregolden pins the JSON of each request and
// reply, testdata here that of SeatInfo and Provision).
package api
