// Package sdk is the Go library a module uses to talk to its node's bus. A module holds only
// its nkey seed (written at registration); Connect learns from the bus which module that seed
// is and what it declared, so the library refuses an undeclared call itself, with an error
// that says what to declare, before the bus refuses it.
//
//	c, err := sdk.Connect(ctx, "nats://127.0.0.1:4222", "billing.nk")
//	c.On("shop.order.placed", func(ctx context.Context, e sdk.Event) error { … })
//	c.Emit(ctx, "invoice.created", invoice)
//	c.Serve("status", func(ctx context.Context, r sdk.Request) ([]byte, error) { … })
//	c.Call(ctx, "mailer", "status", nil)
//	c.Submit(ctx, "mailer", "send", mail)
//
// Delivery is at least once: a handler that returns an error is retried with back-off, and
// after the consumer's MaxDeliver attempts the event is written to DEAD with the reason and
// then acked — never silently dropped. Handlers should be idempotent; Dedup helps.
package sdk
