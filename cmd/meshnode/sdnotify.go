package main

import (
	"net"
	"os"
)

// sdNotify tells systemd about the service's state when it runs under Type=notify; without
// NOTIFY_SOCKET it does nothing. The protocol is one datagram, so no library is needed.
func sdNotify(state string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer conn.Close()
	conn.Write([]byte(state))
}
