// Package cni is the glue the netwarden CNI meta plugins share: config parsing with errors that
// name the field, the five CNI 1.1 verbs, attachment identity and the per-invocation lock, and
// the kernel stores that keep one chain per attachment in nftables or iptables.
package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Attachment is what the CNI spec identifies an attachment by: the network name, the interface
// name in the container and the container ID. Every rule the plugins install belongs to one.
type Attachment struct {
	Network     string
	IfName      string
	ContainerID string
}

func (a Attachment) String() string {
	return fmt.Sprintf("network=%s ifname=%s containerID=%s", a.Network, a.IfName, a.ContainerID)
}

// NetworkTag is the part of every chain name that says which network owns it, so GC of one
// network never touches another's chains.
func NetworkTag(network string) string {
	sum := sha256.Sum256([]byte("network\x00" + network))
	return hex.EncodeToString(sum[:4])
}

// ID names the attachment in chain names: the network tag, then a hash of all three keys.
// 8+1+12 characters keeps "PREFIX-" + ID within iptables' 28-character chain names.
func (a Attachment) ID() string {
	sum := sha256.Sum256([]byte(a.Network + "\x00" + a.IfName + "\x00" + a.ContainerID))
	return NetworkTag(a.Network) + "-" + hex.EncodeToString(sum[:6])
}

// Buckets is how many dispatch chains a group spreads its attachments over: a DEL lists only one
// bucket instead of every attachment on the node, and a packet walks one short bucket.
const Buckets = 64

// BucketOf returns the bucket of an attachment ID.
func BucketOf(id string) int {
	sum := sha256.Sum256([]byte(id))
	return int(sum[0]) % Buckets
}

// jumpComment is the comment of a bucket's jump rule: the target chain's name (which DEL matches)
// and, for people reading the ruleset, the attachment it belongs to, within the kernel's
// 128-byte comment limit.
func jumpComment(chain string, a Attachment) string {
	s := chain + " " + strings.Map(func(r rune) rune {
		if r < ' ' || r == '"' || r == '\\' || r > '~' {
			return -1
		}
		return r
	}, a.String())
	if len(s) > 127 {
		s = s[:127]
	}
	return s
}

// isJumpComment reports whether a rule comment marks a jump to chain.
func isJumpComment(comment, chain string) bool {
	return comment == chain || strings.HasPrefix(comment, chain+" ")
}
