package manifest

// The whole grant of a module's key, in one place: what its declaration derives, plus what
// the mesh itself lets every module key do. The bus applies exactly this (and a seat's
// HolderPermissions on top for the holding instance), `meshnode module show` prints it, and
// any change of it kicks the module's connections.

// OperatorInbox is the inbox prefix of the operator's connections (the CLI sets it; with the
// plain NATS CLI, --inbox-prefix _INBOX.operator): where a module's tools answer. "operator"
// is a reserved module name, so no module's inbox is this one.
const OperatorInbox = "_INBOX.operator"

// ProvisionInbox is where the mesh-controller's holder hears provisioners' answers
// (_INBOX._provision.<node>.…): the holder of a seat that provides an interface may answer
// there, and no module may listen there (a module hears only its own inbox).
const ProvisionInbox = "_INBOX._provision"

// The mesh's own seats: the controller (registration, whoami, seats) and the vault. A module
// key may reach their tools without declaring them.
const (
	ControllerSeat = "mesh-controller"
	VaultSeat      = "mesh-vault"
)

// WhoamiSubject is where the holder of publicKey asks the controller which module it is: the
// one question a client holding only its seed must ask before it knows its own name. The key
// in the subject is the proof of who asks: only that key may publish there.
func WhoamiSubject(publicKey string) string {
	return SeatToolSubject(ControllerSeat, "whoami") + "." + publicKey
}

// WhoamiSubjects is every key's whoami subject: what the controller answers.
var WhoamiSubjects = SeatToolSubject(ControllerSeat, "whoami.*")

// BootstrapInbox is where the holder of publicKey hears whoami's answer: keyed by the
// public key, because before the answer the client does not know its name.
func BootstrapInbox(publicKey string) string { return "_INBOX." + publicKey }

// VaultFetchSubject is where module fetches its own secrets from the vault:
// mesh.seat.mesh-vault.tool.fetch.mod.<module>. The module's name in the subject is the
// proof of who asks.
func VaultFetchSubject(module string) string {
	return SeatToolSubject(VaultSeat, "fetch") + ".mod." + module
}

// nodeAny is the node token of a grant that holds on every node: a module's
// instance asks whichever node it is connected to about its seats.
const nodeAny = "*"

// Grant returns every permission a connection of the module with publicKey has, whoever
// holds what: the derived Permissions; the bootstrap (ask whoami, hear it on the key's
// inbox); for a module that declares seats, asking its node to hold them; for one that names
// secrets, fetching them. A module that does not require mesh-bus has no grant at all.
func (d *Derivation) Grant(publicKey string) Permissions {
	if !d.Bus {
		return Permissions{}.normal()
	}
	extra := Permissions{
		Publish:   []string{WhoamiSubject(publicKey)},
		Subscribe: []Subscription{{Subject: BootstrapInbox(publicKey) + ".>"}},
	}
	if len(d.Seats) > 0 {
		extra.Publish = append(extra.Publish, NodeSeatToolSubject(nodeAny, d.Module))
	}
	if len(d.Secrets) > 0 {
		extra.Publish = append(extra.Publish, VaultFetchSubject(d.Module))
	}
	return d.Permissions.Merge(extra)
}

// HolderGrant is what the instance holding seat on node adds to Grant: HolderPermissions,
// and — when the seat serves tools — answering into the inboxes of the modules that call
// them (callers: the registered modules that use the seat; the operator's inbox is in
// HolderPermissions already). The callers come from the catalogue, so the bus asks again
// whenever they change.
func (d *Derivation) HolderGrant(seat, node string, callers []string) (Permissions, error) {
	p, err := d.HolderPermissions(seat, node)
	if err != nil || !p.AllowResponses {
		return p, err
	}
	answers := make([]string, len(callers))
	for i, c := range callers {
		answers[i] = InboxPrefix(c) + ".>"
	}
	return p.Merge(Permissions{Publish: answers}), nil
}
