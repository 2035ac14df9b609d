// Package jsonschema is cellbox's copy of
// github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 (Apache 2.0, see LICENSE),
// with two patches: each draft's metaschema is compiled on first use rather
// than in the package init, and Compiler.SkipMetaValidation. It lives in
// cellbox's module, rather than replacing the upstream module in go.mod,
// so that modules importing cellbox build with it: Go ignores the replace
// directives of dependencies. PATCHES.md says what changed and why.
// cellbox's internal/jsonschema is its one importer.
package jsonschema
