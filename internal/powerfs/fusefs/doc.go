// Package fusefs is the file system behind powerfs: a passthrough FUSE mount
// over a backing directory that remembers every change since the last sync
// and, on a cut, throws those changes away (or, torn, a random part of
// them). The powerfs helper process (internal/powerfs/cmd/powerfs) serves
// it; tests use it through internal/powerfs, never directly, so that the
// file system runs outside the -race test binary.
//
// It is built on github.com/hanwen/go-fuse/v2, which does not compile for
// GOARCH=arm: everything but this file is behind `linux && !arm`, and on
// other platforms the package is empty.
package fusefs
