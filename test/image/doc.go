// Package image checks the container image: built as `make image` builds it, unpacked and run
// in a network namespace.
package image
