package state

import "fmt"

// The checks every implementation makes before it reads or writes, so that
// all refuse the same calls with the same errors.

// Check returns nil for a valid kind (1 to 64 bytes of a-z, 0-9 and '_'),
// an error wrapping ErrInvalid otherwise.
func (k Kind) Check() error {
	if len(k) == 0 || len(k) > 64 {
		return fmt.Errorf("%w: kind %q is not 1 to 64 bytes", ErrInvalid, k)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return fmt.Errorf("%w: kind %q has a byte other than a-z, 0-9 and '_'", ErrInvalid, k)
		}
	}
	return nil
}

// CheckKey returns nil for a valid key, counter or holder (what names
// which, for the error): 1 to MaxKey bytes. Otherwise the error wraps
// ErrInvalid.
func CheckKey(what, key string) error {
	if key == "" || len(key) > MaxKey {
		return fmt.Errorf("%w: a %s must be 1 to %d bytes, not %d", ErrInvalid, what, MaxKey, len(key))
	}
	return nil
}

// CheckOps returns nil if every op has a valid kind and key and no two
// name one record; otherwise an error wrapping ErrInvalid.
func CheckOps(ops []Op) error {
	type name struct {
		kind Kind
		key  string
	}
	seen := make(map[name]bool, len(ops))
	for _, op := range ops {
		if err := op.Kind.Check(); err != nil {
			return err
		}
		if err := CheckKey("key", op.Key); err != nil {
			return err
		}
		id := name{op.Kind, op.Key}
		if seen[id] {
			return fmt.Errorf("%w: the commit names %s/%q twice", ErrInvalid, op.Kind, op.Key)
		}
		seen[id] = true
	}
	return nil
}
