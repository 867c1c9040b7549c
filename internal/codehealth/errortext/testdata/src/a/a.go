// Package a holds the cases errortext must report (each with a want comment) and those it
// must not.
package a

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
)

var errGone = errors.New("gone")

// refusal is an error of our own with a pointer receiver.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

// notAnError has an Error method that is not error's.
type notAnError struct{}

func (notAnError) Error(n int) string { return fmt.Sprint(n) }

// label is not an error; its String method is not a message.
type label string

func (l label) String() string { return string(l) }

var pattern = regexp.MustCompile(`timeout`)

func direct(err error) bool {
	if err.Error() == "gone" { // want `compares an error's message with ==`
		return true
	}
	if "gone" != err.Error() { // want `compares an error's message with !=`
		return true
	}
	return strings.Contains(err.Error(), "timeout") || // want `reads an error's message with strings.Contains`
		strings.HasPrefix(err.Error(), "nats:") || // want `reads an error's message with strings.HasPrefix`
		strings.HasSuffix(err.Error(), "refused") || // want `reads an error's message with strings.HasSuffix`
		strings.EqualFold(err.Error(), "EOF") || // want `reads an error's message with strings.EqualFold`
		pattern.MatchString(err.Error()) // want `reads an error's message with regexp's MatchString`
}

func switched(err error) int {
	switch err.Error() { // want `switches on an error's message`
	case "gone":
		return 1
	}
	return 0
}

func throughVariables(err error) bool {
	msg := err.Error()
	lower := strings.ToLower(msg)
	var again = lower
	if strings.Contains(again, "timeout") { // want `reads an error's message with strings.Contains`
		return true
	}
	var later string
	later = msg
	switch later { // want `switches on an error's message`
	case "gone":
		return true
	}
	if rest, ok := strings.CutPrefix(msg, "nats: "); ok { // want `reads an error's message with strings.CutPrefix`
		return rest == "" // want `compares an error's message with ==`
	}
	head := msg[:4]
	return head == "nats" // want `compares an error's message with ==`
}

func ourOwnType(r *refusal, v refusal) bool {
	return strings.Contains(r.Error(), "why") || v.Error() == "" // want `reads an error's message with strings.Contains` `compares an error's message with ==`
}

func joined(err error) bool {
	return "nats: "+err.Error() == "nats: gone" // want `compares an error's message with ==`
}

// The cases below read no error's message.

func byType(err error) bool {
	var r *refusal
	return errors.Is(err, errGone) || errors.As(err, &r) || err == io.EOF
}

func printed(err error) string {
	msg := err.Error()
	fmt.Println(msg)
	first, _, _ := strings.Cut(msg, "\n")
	fmt.Println(first)
	return fmt.Sprintf("open: %v (%s)", err, msg)
}

func otherStrings(l label, n notAnError, s string) bool {
	name := l.String()
	text := n.Error(3)
	return strings.Contains(s, "x") || name == "x" || text == "3" || strings.HasPrefix(name, "x")
}

func shadowed(err error) bool {
	msg := err.Error()
	_ = msg
	{
		msg := "fresh"
		return msg == "fresh"
	}
}
