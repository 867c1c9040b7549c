package errortext

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// Analyzer reports an error told apart by its message.
var Analyzer = &analysis.Analyzer{
	Name:     "errortext",
	Doc:      "report control flow that tells errors apart by their message instead of by type or code",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

// searches are the strings functions that decide on a string's content, by name. Those
// that only cut a string up (Cut, Index) are left out: taking a message's first line to
// print it is not telling errors apart.
var searches = map[string]bool{
	"Contains": true, "ContainsAny": true, "ContainsRune": true, "HasPrefix": true,
	"HasSuffix": true, "EqualFold": true, "CutPrefix": true, "CutSuffix": true,
}

// passThrough are the strings functions whose result is still the message they were given.
var passThrough = map[string]bool{"ToLower": true, "ToUpper": true, "TrimSpace": true}

// matches are the regexp.Regexp methods that read a string's content.
var matches = map[string]bool{
	"MatchString": true, "FindString": true, "FindStringIndex": true, "FindStringSubmatch": true,
	"FindStringSubmatchIndex": true, "FindAllString": true, "FindAllStringSubmatch": true,
}

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	m := messages{info: pass.TypesInfo, vars: map[types.Object]bool{}}

	// Which variables hold a message: every assignment is read again until none adds one,
	// since a variable may be assigned from another declared after it in the source.
	type assign struct {
		to   *ast.Ident
		from ast.Expr
		cut  bool // to is one of several results of from, a call: a part when it cuts a message
	}
	var assigns []assign
	add := func(lhs []ast.Expr, names []*ast.Ident, rhs []ast.Expr) {
		for _, l := range lhs {
			if id, ok := ast.Unparen(l).(*ast.Ident); ok {
				names = append(names, id)
			}
		}
		for i, id := range names {
			switch {
			case len(names) == len(rhs):
				assigns = append(assigns, assign{to: id, from: rhs[i]})
			case len(rhs) == 1:
				assigns = append(assigns, assign{to: id, from: rhs[0], cut: true})
			}
		}
	}
	ins.Preorder([]ast.Node{(*ast.AssignStmt)(nil), (*ast.ValueSpec)(nil)}, func(n ast.Node) {
		switch n := n.(type) {
		case *ast.AssignStmt:
			add(n.Lhs, nil, n.Rhs)
		case *ast.ValueSpec:
			add(nil, n.Names, n.Values)
		}
	})
	for added := true; added; {
		added = false
		for _, a := range assigns {
			obj, ok := m.object(a.to).(*types.Var)
			if !ok || m.vars[obj] {
				continue
			}
			if (a.cut && m.cuts(a.from) && isString(obj.Type())) || (!a.cut && m.is(a.from)) {
				m.vars[obj] = true
				added = true
			}
		}
	}

	ins.Preorder([]ast.Node{(*ast.BinaryExpr)(nil), (*ast.CallExpr)(nil), (*ast.SwitchStmt)(nil)}, func(n ast.Node) {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if (n.Op == token.EQL || n.Op == token.NEQ) && (m.is(n.X) || m.is(n.Y)) {
				report(pass, n, "compares an error's message with "+n.Op.String())
			}
		case *ast.SwitchStmt:
			if n.Tag != nil && m.is(n.Tag) {
				report(pass, n, "switches on an error's message")
			}
		case *ast.CallExpr:
			fn, _ := typeutil.Callee(pass.TypesInfo, n).(*types.Func)
			if fn == nil || !m.anyArg(n) {
				return
			}
			if name, ok := stringsFunc(fn); ok && searches[name] {
				report(pass, n, "reads an error's message with strings."+name)
			} else if name, ok := regexpMethod(fn); ok && matches[name] {
				report(pass, n, "reads an error's message with regexp's "+name)
			}
		}
	})
	return nil, nil
}

func report(pass *analysis.Pass, n ast.Node, what string) {
	pass.ReportRangef(n, "%s: tell errors apart by type or code (errors.Is, errors.As, jetstream.APIError.ErrorCode), never by text", what)
}

// messages tells whether an expression is an error's message.
type messages struct {
	info *types.Info
	vars map[types.Object]bool // variables assigned a message
}

func (m messages) object(id *ast.Ident) types.Object {
	if obj := m.info.Defs[id]; obj != nil {
		return obj
	}
	return m.info.Uses[id]
}

func (m messages) anyArg(call *ast.CallExpr) bool {
	for _, a := range call.Args {
		if m.is(a) {
			return true
		}
	}
	return false
}

// is reports whether e is an error's message: see the package's doc.
func (m messages) is(e ast.Expr) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		obj, ok := m.object(e).(*types.Var)
		return ok && m.vars[obj]
	case *ast.SliceExpr:
		return m.is(e.X)
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (m.is(e.X) || m.is(e.Y))
	case *ast.CallExpr:
		if m.errorMethod(e) {
			return true
		}
		fn, _ := typeutil.Callee(m.info, e).(*types.Func)
		name, ok := stringsFunc(fn)
		return ok && passThrough[name] && len(e.Args) == 1 && m.is(e.Args[0])
	}
	return false
}

// cuts reports whether e is a call of strings.Cut, CutPrefix or CutSuffix on a message: its
// string results are parts of it.
func (m messages) cuts(e ast.Expr) bool {
	call, ok := ast.Unparen(e).(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return false
	}
	fn, _ := typeutil.Callee(m.info, call).(*types.Func)
	name, ok := stringsFunc(fn)
	return ok && (name == "Cut" || name == "CutPrefix" || name == "CutSuffix") && m.is(call.Args[0])
}

func isString(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsString != 0
}

// errorType is the predeclared error interface.
var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

// errorMethod reports whether call is x.Error() on a value x whose type is an error.
func (m messages) errorMethod(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Error" || len(call.Args) != 0 {
		return false
	}
	s := m.info.Selections[sel]
	if s == nil || s.Kind() != types.MethodVal {
		return false
	}
	recv := s.Recv()
	return types.Implements(recv, errorType) || types.Implements(types.NewPointer(recv), errorType)
}

// stringsFunc returns fn's name when it is a function of package strings.
func stringsFunc(fn *types.Func) (string, bool) {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "strings" || fn.Signature().Recv() != nil {
		return "", false
	}
	return fn.Name(), true
}

// regexpMethod returns fn's name when it is a method of regexp.Regexp.
func regexpMethod(fn *types.Func) (string, bool) {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "regexp" || fn.Signature().Recv() == nil {
		return "", false
	}
	return fn.Name(), true
}
