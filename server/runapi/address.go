package runapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/suggest"
)

// Loaded names a loaded pattern instance, for address resolution.
type Loaded struct{ Space, Name string }

func (l Loaded) key() string { return l.Space + "/" + l.Name }

// Resolve turns a cell address as a user writes it ("name", "pattern/name"
// or "space/pattern/name"; see the package doc) into a full address. loaded
// lists the loaded instances in load order (none when no runtime runs, as
// for the CLI reading a store directly). It does not check that the cell
// exists (Lookup does).
func Resolve(store cells.Store, loaded []Loaded, addr string) (cells.Address, error) {
	parts := strings.Split(addr, "/")
	var a cells.Address
	switch len(parts) {
	case 3:
		a = cells.Address{Space: parts[0], Pattern: parts[1], Name: parts[2]}
	case 2:
		a = cells.Address{Space: DefaultSpace, Pattern: parts[0], Name: parts[1]}
		for _, l := range loaded {
			if l.Name == parts[0] {
				a.Space = l.Space
				break
			}
		}
	case 1:
		if len(loaded) > 0 {
			a = cells.Address{Space: loaded[0].Space, Pattern: loaded[0].Name, Name: addr}
			break
		}
		found, err := byName(store, addr)
		if err != nil {
			return a, err
		}
		switch len(found) {
		case 0:
			return a, notFound(store, cells.Address{Name: addr})
		case 1:
			return found[0], nil
		}
		full := make([]string, len(found))
		for i, f := range found {
			full[i] = f.String()
		}
		return a, errorf(400, "cell name %q is ambiguous: write pattern/name or space/pattern/name (%s)", addr, strings.Join(full, ", "))
	default:
		return a, errorf(400, "cell address %q: want name, pattern/name or space/pattern/name", addr)
	}
	if err := a.Valid(); err != nil {
		return a, &Error{Status: 400, Message: err.Error() + " (want name, pattern/name or space/pattern/name)"}
	}
	return a, nil
}

// Lookup resolves addr (as Resolve does) and returns its cell. An unknown
// cell is a 404 *Error that suggests the nearest known name.
func Lookup(store cells.Store, loaded []Loaded, addr string) (cells.Cell, error) {
	a, err := Resolve(store, loaded, addr)
	if err != nil {
		return cells.Cell{}, err
	}
	c, err := store.Get(context.Background(), a)
	if errors.Is(err, cells.ErrNotFound) {
		if !strings.Contains(addr, "/") && len(loaded) > 1 {
			if e := elsewhere(store, loaded, a); e != nil {
				return c, e
			}
		}
		return c, notFound(store, a)
	}
	if err != nil {
		return c, fmt.Errorf("read cell %s: %w", a, err)
	}
	return c, nil
}

// elsewhere is the 404 for a bare cell name that the first loaded
// instance (a) lacks but later loaded ones have: it names them, as the
// addresses to write instead. nil when none has it.
func elsewhere(store cells.Store, loaded []Loaded, a cells.Address) *Error {
	var there []string
	_ = store.View(context.Background(), func(tx cells.Tx) error {
		for _, l := range loaded[1:] {
			if _, err := tx.Get(cells.Address{Space: l.Space, Pattern: l.Name, Name: a.Name}); err == nil {
				short := l.Name + "/" + a.Name
				if l.Space != DefaultSpace {
					short = l.key() + "/" + a.Name
				}
				there = append(there, short)
			}
		}
		return nil
	})
	if len(there) == 0 {
		return nil
	}
	e := errorf(404, "no cell %q in pattern %s/%s, the first loaded (a bare name is a cell of the first loaded pattern); loaded patterns that have it: %s",
		a.Name, a.Space, a.Pattern, strings.Join(there, ", "))
	e.Suggestion = there[0]
	return e
}

// ResolvePrefix turns a watch or list prefix into an address prefix: a
// prefix naming a pattern instance ("csv" or "default/csv", loaded or in
// the store) means its cells ("default/csv/"); one naming a cell as Resolve
// takes it ("report", "repl/report") means that cell (and its streams,
// "default/repl/report.out"); anything else is matched against full
// addresses as it is. Either way the store matches it in whole segments
// (cells.HasPrefix): "big/s" is not "big/small".
func ResolvePrefix(store cells.Store, loaded []Loaded, prefix string) (string, error) {
	p, err := resolveInstancePrefix(store, loaded, prefix)
	if err != nil || p != prefix || prefix == "" || strings.HasSuffix(prefix, "/") || strings.Count(prefix, "/") > 1 {
		return p, err
	}
	if c, err := Lookup(store, loaded, prefix); err == nil {
		return c.Addr.String(), nil
	}
	return prefix, nil
}

func resolveInstancePrefix(store cells.Store, loaded []Loaded, prefix string) (string, error) {
	name := strings.TrimSuffix(prefix, "/")
	if name == "" {
		return prefix, nil
	}
	for _, l := range loaded {
		if name == l.Name || name == l.key() {
			return l.key() + "/", nil
		}
	}
	if strings.Count(name, "/") > 1 {
		return prefix, nil
	}
	stored, err := instancesIn(store)
	if err != nil {
		return "", err
	}
	for _, l := range stored {
		if name == l.Name || name == l.key() {
			return l.key() + "/", nil
		}
	}
	return prefix, nil
}

// byName returns the addresses of the cells called name, in any instance.
func byName(store cells.Store, name string) ([]cells.Address, error) {
	var out []cells.Address
	err := store.View(context.Background(), func(tx cells.Tx) error {
		all, err := tx.List("")
		for _, c := range all {
			if c.Addr.Name == name {
				out = append(out, c.Addr)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("look for cell %q: %w", name, err)
	}
	return out, nil
}

// instancesIn lists the pattern instances that have cells in the store.
func instancesIn(store cells.Store) ([]Loaded, error) {
	var out []Loaded
	err := store.View(context.Background(), func(tx cells.Tx) error {
		all, err := tx.List("")
		for _, c := range all {
			l := Loaded{Space: c.Addr.Space, Name: c.Addr.Pattern}
			if len(out) == 0 || out[len(out)-1] != l {
				out = append(out, l)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pattern instances: %w", err)
	}
	return out, nil
}

// notFound is the 404 for an unknown cell, with the nearest name of its
// instance (or, for an unknown instance, the instances there are).
func notFound(store cells.Store, a cells.Address) *Error {
	stored, _ := instancesIn(store)
	prefix := a.Prefix()
	if a.Pattern == "" {
		prefix = ""
	}
	var names []string
	_ = store.View(context.Background(), func(tx cells.Tx) error {
		cs, err := tx.List(prefix)
		for _, c := range cs {
			names = append(names, c.Addr.Name)
		}
		return err
	})
	if a.Pattern == "" { // a bare name with no pattern loaded
		e := errorf(404, "no cell %q in any pattern", a.Name)
		if len(stored) == 0 {
			e.Message += ": the store is empty; run a pattern first (`cellbox run PATTERN`)"
		}
		if s := suggest.Nearest(a.Name, names); s != "" {
			e.Suggestion = s
			e.Message += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return e
	}
	if len(names) == 0 {
		keys := make([]string, len(stored))
		for i, l := range stored {
			keys[i] = l.key()
		}
		e := errorf(404, "no cell %s: there is no pattern instance %s/%s", a, a.Space, a.Pattern)
		if len(keys) > 0 {
			e.Message += " (instances: " + strings.Join(keys, ", ") + ")"
		}
		if s := suggest.Nearest(a.Space+"/"+a.Pattern, keys); s != "" {
			e.Suggestion = s + "/" + a.Name
		}
		return e
	}
	e := errorf(404, "no cell %q in pattern %s/%s", a.Name, a.Space, a.Pattern)
	if s := suggest.Nearest(a.Name, names); s != "" {
		e.Suggestion = s
		e.Message += fmt.Sprintf(" (did you mean %q?)", s)
	} else {
		e.Message += " (cells: " + strings.Join(names, ", ") + ")"
	}
	return e
}
