// Package floors holds the test that keeps cellbox's floors (DESIGN.md,
// "The house": data flows down, no package reaches up a floor):
// TestFloors checks every package's imports against a table of floors. It
// has no code.
package floors
