// Package errortext is a go/analysis analyzer that reports control flow reading an error's
// message: errors are told apart by type and code (errors.Is, errors.As,
// jetstream.APIError.ErrorCode), since a message that changes upstream silently turns a
// retry into a failure.
//
// It follows the types rather than the text of the source, so it sees through a variable:
// a string is an error's message when it is the result of the Error method of a value whose
// type is an error, a variable assigned such a string (with :=, = or var, through any chain
// of variables), a slice of one, one joined to another string, one passed through
// strings.ToLower, ToUpper or TrimSpace, or a part of one that strings.Cut, CutPrefix or
// CutSuffix returns. Reading such a string is reported when it is
// compared (== or !=), switched on, searched (strings.Contains, ContainsAny, ContainsRune,
// HasPrefix, HasSuffix, EqualFold, CutPrefix, CutSuffix) or matched by a regexp.
//
// Printing or wrapping a message is not reading it. A message is followed within a
// package's code, not into a function it is passed to as a plain string parameter.
package errortext
