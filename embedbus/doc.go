// Package embedbus adapts nats-server to meshnode: it builds the server's options from the
// node's, starts it with JetStream inside the process, routes its log through slog, and
// hands the node's own actors an in-process connection that needs no socket.
//
// nats-server is written to own a process: it installs signal handlers, mutates the options
// it is given and calls Fatalf (which its default logger turns into os.Exit). Bus undoes each:
// NoSigs is set, the options are cloned, and Fatalf is recorded and returned as an error.
package embedbus
