package codehealth

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// nodeKeyOwner is the one file whose logger.With may add the key "node": node.New and Open
// tag the node's logger with its own name, and every part of the node logs through it.
const nodeKeyOwner = "node/node.go"

// TestNoLogKeyNode: no log call but nodeKeyOwner's With adds the key "node". Every part of a
// node logs through a logger that already carries it (the node's own name), so a second
// "node" — another node's name, say — would be a duplicate key in a JSON log line, which
// most readers of JSON keep only one of. Another node is named under another key (peer,
// target_node).
func TestNoLogKeyNode(t *testing.T) {
	files := sources(t, func(path string) bool { return !strings.HasSuffix(path, "_test.go") })
	if len(files) < 100 {
		t.Fatalf("read %d files: the walk missed the repository", len(files))
	}
	fset := token.NewFileSet()
	for rel, src := range files {
		f, err := parser.ParseFile(fset, rel, src, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", rel, err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if rel == nodeKeyOwner && isWith(call) {
				return true
			}
			if key, ok := logKey(call, "node"); ok {
				t.Errorf("%s: logs the key %q, which the node's logger already carries: name another node %q or %q",
					fset.Position(key.Pos()), "node", "peer", "target_node")
			}
			return true
		})
	}
}

// logKeyFirst is where a slog method's first key is among its arguments: after the message,
// or first for With.
var logKeyFirst = map[string]int{"Debug": 1, "Info": 1, "Warn": 1, "Error": 1, "With": 0}

// logKey returns the argument of call that is the literal key want, when call is a slog-like
// logger method (x.Info(msg, k, v, ...), x.With(k, v, ...)) with want in a key's place.
func logKey(call *ast.CallExpr, want string) (ast.Expr, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil, false
	}
	first, ok := logKeyFirst[sel.Sel.Name]
	if !ok {
		return nil, false
	}
	for i := first; i < len(call.Args); i += 2 {
		lit, ok := call.Args[i].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			continue
		}
		if s, err := strconv.Unquote(lit.Value); err == nil && s == want {
			return lit, true
		}
	}
	return nil, false
}

// isWith reports whether call is a method call named With.
func isWith(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "With"
}
