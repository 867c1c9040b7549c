package manifest

import (
	"errors"
	"regexp"
	"strconv"
	"strings"

	"github.com/meshnode/meshnode/internal/suggest"
	"go.yaml.in/yaml/v3"
)

// Turning yaml.v3's decoding errors into refusals, and finding the line of a field.

// MaxSize is the largest manifest the mesh takes, in bytes of YAML: 64 KiB. A registration's
// request and reply, and a registry record, then fit the bus's 1 MiB payload with room to
// spare (a 760 KB manifest once registered, but its reply did not fit and the seed was lost).
// Real manifests are a few hundred bytes.
const MaxSize = 64 << 10

// CheckSize refuses a manifest of size bytes over MaxSize, naming both; nil when it fits.
// The refusal is a Refusals, like every other.
func CheckSize(size int) error {
	if size <= MaxSize {
		return nil
	}
	return Refusals{{
		Code:    CodeSize,
		Value:   strconv.Itoa(size) + " bytes",
		Reason:  "the manifest is larger than the limit of " + strconv.Itoa(MaxSize) + " bytes (64 KiB)",
		Instead: "declare less: a manifest names events, tools and seats, never data",
	}}
}

// The messages of yaml.v3's TypeError, which are the only way it names the line and key.
var (
	unknownFieldRE = regexp.MustCompile(`^line (\d+): field (.+) not found in type manifest\.raw(\w+)$`)
	duplicateKeyRE = regexp.MustCompile(`^line (\d+): mapping key "(.*)" already defined at line (\d+)$`)
	wrongShapeRE   = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")
	syntaxLineRE   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	requirementRE  = regexp.MustCompile(`^line (\d+): (a requirement is .*)$`)
)

// decodeRefusals turns a yaml.v3 decoding error into refusals that name the field, line and
// what to write, so a user never reads a Go type name.
func decodeRefusals(err error, data []byte) Refusals {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		msg := err.Error()
		r := Refusal{Code: CodeYAML, Reason: "not valid YAML: " + strings.TrimPrefix(msg, "yaml: "), Instead: "fix the YAML syntax"}
		if sm := syntaxLineRE.FindStringSubmatch(msg); sm != nil {
			r.Line, _ = strconv.Atoi(sm[1])
			r.Reason = "not valid YAML: " + sm[2]
		}
		return Refusals{r}
	}
	idx := indexLines(data)
	var rs Refusals
	for _, msg := range te.Errors {
		rs = append(rs, decodeRefusal(msg, idx))
	}
	return rs
}

func decodeRefusal(msg string, idx *lineIndex) Refusal {
	if sm := unknownFieldRE.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		key := sm[2]
		known := manifestKeys
		switch sm[3] {
		case "Seat":
			known = seatKeys
		case "Build":
			known = buildKeys
		case "Version":
			known = versionKeys
		case "Limits":
			known = limitsKeys
		}
		instead := "write one of " + strings.Join(known, ", ")
		if near := suggest.Nearest(key, known); near != "" {
			instead = "write " + near + " (or one of " + strings.Join(known, ", ") + ")"
		}
		return Refusal{
			Code:    CodeUnknownKey,
			Field:   idx.keyPath(line, key),
			Value:   key,
			Reason:  "unknown key",
			Instead: instead,
			Line:    line,
		}
	}
	if sm := duplicateKeyRE.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		return Refusal{
			Code:    CodeDuplicate,
			Field:   idx.keyPath(line, sm[2]),
			Value:   sm[2],
			Reason:  "duplicate key: already defined at line " + sm[3],
			Instead: "merge the two into one entry",
			Line:    line,
		}
	}
	if sm := wrongShapeRE.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		field, value := idx.valueAt(line, sm[2], sm[3])
		r := Refusal{Code: CodeShape, Field: field, Value: value, Line: line}
		switch into := sm[4]; {
		case into == "[]string" || into == "[]manifest.rawRequirement":
			r.Reason = "must be a list of names"
			r.Instead = "write " + lastKey(field) + ": [" + value + "]"
			if sm[2] != "str" || value == "" {
				r.Instead = "write " + lastKey(field) + ": [name, ...]"
			}
		case into == "string":
			r.Reason = "must be a single name, not a " + shapeName(sm[2])
			r.Instead = "write " + lastKey(field) + ": <name>"
		case into == "map[string]manifest.rawVersion":
			r.Reason = "must be a mapping of version names (v2 … v9) to protocols"
			r.Instead = "write versions: {v2: {accepts: [<verb>]}}"
		case strings.HasPrefix(into, "map["):
			r.Reason = "must be a mapping of seat names to seats"
			r.Instead = "write seats: {<seat>: {scope: mesh, retain: 7d, accepts: [<verb>]}}"
		case into == "manifest.rawSeat":
			r.Reason = "a seat must be a mapping of " + strings.Join(seatKeys, ", ")
			r.Instead = "write " + lastKey(field) + ": {scope: mesh, retain: 7d, accepts: [<verb>]}"
		case into == "manifest.rawVersion":
			r.Reason = "a seat's version must be a mapping of " + strings.Join(versionKeys, ", ")
			r.Instead = "write " + lastKey(field) + ": {accepts: [<verb>]}"
		case into == "manifest.rawBuild":
			r.Reason = "build must be a mapping"
			r.Instead = "write build: {on: [<module>]}"
		default: // manifest.rawManifest: the document itself
			r.Reason = "a manifest must be a mapping of " + strings.Join(manifestKeys, ", ")
			r.Instead = "write module: <name> and the keys it needs"
		}
		return r
	}
	if sm := requirementRE.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		return Refusal{Code: CodeShape, Field: "requires", Line: line, Reason: sm[2],
			Instead: `write - postgres, or - postgres: {connection-limit: "5"}`}
	}
	return Refusal{Code: CodeYAML, Reason: msg, Instead: "fix the YAML"}
}

func shapeName(tag string) string {
	switch tag {
	case "seq":
		return "list"
	case "map":
		return "mapping"
	}
	return tag
}

// lastKey returns the last key of a field path: "seats.x.accepts" → "accepts".
func lastKey(field string) string {
	if i := strings.LastIndexByte(field, '['); i >= 0 {
		field = field[:i]
	}
	if i := strings.LastIndexByte(field, '.'); i >= 0 {
		return field[i+1:]
	}
	return field
}

// lineIndex maps the field paths of a YAML manifest ("consumes[1]",
// "seats.telegram-sender.retain") to their lines, so refusals can point at them.
type lineIndex struct {
	first  map[string]int      // path → line of its first occurrence
	byLine map[int][]lineEntry // every key and value, in document order, by line
}

type lineEntry struct {
	path  string
	key   bool // a mapping key rather than a value
	kind  yaml.Kind
	value string // a scalar's value
}

// indexLines walks data's YAML tree; on a syntax error the index is empty.
func indexLines(data []byte) *lineIndex {
	idx := &lineIndex{first: map[string]int{}, byLine: map[int][]lineEntry{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return idx
	}
	idx.walk("", doc.Content[0], 0)
	return idx
}

func (idx *lineIndex) add(path string, key bool, n *yaml.Node) {
	e := lineEntry{path: path, key: key, kind: n.Kind, value: n.Value}
	idx.byLine[n.Line] = append(idx.byLine[n.Line], e)
	if k := idx.firstKey(path, key); idx.first[k] == 0 {
		idx.first[k] = n.Line
	}
}

func (idx *lineIndex) firstKey(path string, key bool) string {
	if key {
		return path + "\x00key"
	}
	return path
}

func (idx *lineIndex) walk(path string, n *yaml.Node, depth int) {
	if depth > 8 { // a manifest is three levels deep; deeper is someone else's mistake
		return
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx.add(p, true, k)
			idx.add(p, false, v)
			idx.walk(p, v, depth+1)
		}
	case yaml.SequenceNode:
		for i, v := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			idx.add(p, false, v)
			idx.walk(p, v, depth+1)
		}
	}
	// An alias is not followed: its anchor was indexed where it was written, and following
	// aliases lets a few lines of YAML expand exponentially.
}

// line returns the line of field (its key's, for a mapping entry), or of its nearest
// parent present in the source.
func (idx *lineIndex) line(field string) int {
	for field != "" {
		if l := idx.first[idx.firstKey(field, true)]; l > 0 {
			return l
		}
		if l := idx.first[field]; l > 0 {
			return l
		}
		i := max(strings.LastIndexByte(field, '.'), strings.LastIndexByte(field, '['))
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// keyPath returns the path of the mapping key named key on line.
func (idx *lineIndex) keyPath(line int, key string) string {
	for _, e := range idx.byLine[line] {
		if e.key && (e.path == key || strings.HasSuffix(e.path, "."+key)) {
			return e.path
		}
	}
	return key
}

// valueAt returns the path and scalar value of the value on line that yaml.v3 described as
// tag and shown (a scalar cut to seven characters and "..."): the deepest of its shape.
func (idx *lineIndex) valueAt(line int, tag, shown string) (field, value string) {
	kind := yaml.ScalarNode
	switch tag {
	case "seq":
		kind = yaml.SequenceNode
	case "map":
		kind = yaml.MappingNode
	}
	shown = strings.TrimSuffix(shown, "...")
	for _, e := range idx.byLine[line] {
		if e.key || e.kind != kind || !strings.HasPrefix(e.value, shown) {
			continue
		}
		field, value = e.path, e.value
	}
	return field, value
}
