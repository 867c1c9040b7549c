// Package dedupbolt keeps a module's handled event ids in a bbolt file of its own, so
// redelivered events are skipped across restarts; sdk.Dedup keeps them in memory only.
// It is a package of its own so that the sdk links no bbolt: a module opts in by importing it.
//
//	d, err := dedupbolt.Open("billing-dedup.db", 10000)
//	defer d.Close()
//	c.On("shop.order.placed", d.Once("invoice", handler))
package dedupbolt
