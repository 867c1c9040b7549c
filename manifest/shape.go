package manifest

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
)

// Shape is the JSON a seat's verb, tool or event carries, declared in the seat's shapes: a
// subset of JSON Schema — type, required, properties, items, enum — enough for the mesh to
// tell a breaking change (a new required field, a removed field, a narrowed type or enum)
// from an additive one, and for a holder to refuse a payload that does not fit.
type Shape struct {
	// Type is one of object, array, string, number, integer, boolean, null; "" allows any.
	Type string `yaml:"type" json:"type,omitempty"`
	// Required names the properties an object must have.
	Required []string `yaml:"required" json:"required,omitempty"`
	// Properties are the shapes of an object's named properties; others are allowed.
	Properties map[string]*Shape `yaml:"properties" json:"properties,omitempty"`
	// Items is the shape of an array's items.
	Items *Shape `yaml:"items" json:"items,omitempty"`
	// Enum lists the values allowed, as JSON values.
	Enum []any `yaml:"enum" json:"enum,omitempty"`
}

// The keys a shape knows, for the refusal of an unknown one.
var shapeKeys = []string{"type", "required", "properties", "items", "enum"}

var shapeTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

// problems lists what is wrong with s as a declaration, each prefixed with its path.
func (s *Shape) problems(path string) []string {
	if s == nil {
		return []string{path + ": is empty; write a mapping of " + strings.Join(shapeKeys, ", ")}
	}
	var out []string
	if s.Type != "" && !slices.Contains(shapeTypes, s.Type) {
		out = append(out, fmt.Sprintf("%s.type %q: is not one of %s", path, s.Type, strings.Join(shapeTypes, ", ")))
	}
	if (len(s.Required) > 0 || len(s.Properties) > 0) && s.Type != "object" && s.Type != "" {
		out = append(out, path+": required and properties describe an object; write type: object")
	}
	if s.Items != nil && s.Type != "array" && s.Type != "" {
		out = append(out, path+": items describes an array; write type: array")
	}
	for _, r := range s.Required {
		if len(s.Properties) > 0 && s.Properties[r] == nil {
			out = append(out, fmt.Sprintf("%s.required %q: is not one of its properties; add it to properties", path, r))
		}
	}
	for _, name := range sortedKeys(s.Properties) {
		out = append(out, s.Properties[name].problems(path+".properties."+name)...)
	}
	if s.Items != nil {
		out = append(out, s.Items.problems(path+".items")...)
	}
	return out
}

// normalise turns enum values decoded from YAML into the values JSON decoding gives (numbers
// as float64), so Check compares like with like.
func (s *Shape) normalise() {
	if s == nil {
		return
	}
	for i, v := range s.Enum {
		if b, err := json.Marshal(v); err == nil {
			var back any
			if json.Unmarshal(b, &back) == nil {
				s.Enum[i] = back
			}
		}
	}
	for _, p := range s.Properties {
		p.normalise()
	}
	s.Items.normalise()
}

// Check reports whether the JSON value v (as encoding/json decodes into any) fits s.
func (s *Shape) Check(v any) error { return s.check("payload", v) }

func (s *Shape) check(path string, v any) error {
	if s == nil {
		return nil
	}
	if s.Type != "" && !hasType(s.Type, v) {
		return fmt.Errorf("%s: is %s, not %s", path, jsonType(v), s.Type)
	}
	if len(s.Enum) > 0 && !slices.ContainsFunc(s.Enum, func(e any) bool { return reflect.DeepEqual(e, v) }) {
		return fmt.Errorf("%s: %v is not one of %v", path, v, s.Enum)
	}
	switch v := v.(type) {
	case map[string]any:
		for _, r := range s.Required {
			if _, ok := v[r]; !ok {
				return fmt.Errorf("%s: lacks required field %s", path, r)
			}
		}
		for _, name := range sortedKeys(s.Properties) {
			if pv, ok := v[name]; ok {
				if err := s.Properties[name].check(path+"."+name, pv); err != nil {
					return err
				}
			}
		}
	case []any:
		for i, item := range v {
			if err := s.Items.check(fmt.Sprintf("%s[%d]", path, i), item); err != nil {
				return err
			}
		}
	}
	return nil
}

func hasType(t string, v any) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	}
	return true
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// breaks lists how next breaks what a party bound to old relies on: a type changed, a new
// required field, a removed field, an enum value removed or an enum added. A shape added
// where there was none, or removed, or a new optional field, breaks nothing.
func (old *Shape) breaks(path string, next *Shape) []string {
	if old == nil || next == nil {
		return nil
	}
	var out []string
	if old.Type != next.Type && next.Type != "" {
		if old.Type == "" {
			out = append(out, fmt.Sprintf("%s: narrows any value to %s", path, next.Type))
		} else if !(old.Type == "integer" && next.Type == "number") {
			out = append(out, fmt.Sprintf("%s: changes type %s to %s", path, old.Type, next.Type))
		}
	}
	for _, r := range next.Required {
		if !slices.Contains(old.Required, r) {
			out = append(out, fmt.Sprintf("%s: makes %s a required field", path, r))
		}
	}
	for _, name := range sortedKeys(old.Properties) {
		if next.Properties[name] == nil {
			if len(next.Properties) > 0 || next.Type == "object" {
				out = append(out, fmt.Sprintf("%s: removes field %s", path, name))
			}
			continue
		}
		out = append(out, old.Properties[name].breaks(path+"."+name, next.Properties[name])...)
	}
	if len(next.Enum) > 0 {
		if len(old.Enum) == 0 {
			out = append(out, fmt.Sprintf("%s: narrows the values to %v", path, next.Enum))
		} else {
			for _, v := range old.Enum {
				if !slices.ContainsFunc(next.Enum, func(e any) bool { return reflect.DeepEqual(e, v) }) {
					out = append(out, fmt.Sprintf("%s: removes the value %v", path, v))
				}
			}
		}
	}
	out = append(out, old.Items.breaks(path+"[]", next.Items)...)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
