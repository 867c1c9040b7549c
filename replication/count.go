package replication

import (
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/meshnode/meshnode/datadir"
	bolt "go.etcd.io/bbolt"
)

// Count is how many servers the mesh has as one node knows it: the servers whose identities
// the registry holds — joins add one, leave and `node remove` take one away — but, until the
// registry has held as many as the mesh was founded (or grown) with, no fewer than that: the
// founders register one by one while the mesh's buckets and streams are made. That the
// registry has held them is kept in the node's store, so a restart after a removal counts
// what is left.
type Count struct {
	db         *bolt.DB
	founded    func() int // the servers the mesh was founded or grown with
	registered func() int // the servers the registry holds
	log        *slog.Logger
	countedAt  atomic.Int64 // the founding number the registry has held all of; 0 before
}

// countedKey is the store key of Count.countedAt.
const countedKey = "servers-counted"

// NewCount reads what db remembers of the count.
func NewCount(db *bolt.DB, founded, registered func() int, log *slog.Logger) *Count {
	c := &Count{db: db, founded: founded, registered: registered, log: log}
	if v, err := strconv.Atoi(datadir.Value(db, countedKey)); err == nil {
		c.countedAt.Store(int64(v))
	}
	return c
}

// Servers is the count now.
func (c *Count) Servers() int {
	registered, founded := c.registered(), c.founded()
	if c.countedAt.Load() != int64(founded) && registered >= founded {
		if err := datadir.PutValue(c.db, countedKey, strconv.Itoa(founded)); err != nil {
			c.log.Warn("remember that every founding server has registered", "err", err)
		}
		c.countedAt.Store(int64(founded))
	}
	if c.countedAt.Load() == int64(founded) {
		return max(registered, 1)
	}
	return max(registered, founded)
}
