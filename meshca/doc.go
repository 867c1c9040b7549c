// Package meshca is the mesh's certificate authority: the key every route and every
// non-loopback client connection is verified against, and the certificates it issues to the
// mesh's servers.
package meshca
