// Package api holds the types that cross the bus between a module, an operator's client and
// the mesh: requests, replies and the records they carry. It depends on the standard library
// and manifest only, so a client (the sdk, `meshnode`'s client verbs) links no server, and a
// service that answers with another service's data need not import it.
//
// A type here is the wire: its JSON is what other languages' clients read, so a field is
// renamed or dropped only on purpose (testdata holds golden JSON of each type).
package api
