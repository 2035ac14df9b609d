// Package modtest holds tests about cellbox as a Go module seen from
// outside: TestOutsideModuleBuilds builds a module of its own that
// imports cellbox's packages, as another project would. It has no code.
package modtest
