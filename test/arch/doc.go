// Package arch checks rules of the source tree's layout that the compiler does not.
package arch
