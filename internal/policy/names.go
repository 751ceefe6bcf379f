package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// PolicyChainName names the chain holding one policy's rules for one direction. It stays
// readable in `nft list` output; very long names are cut and made unique with a hash. The
// separator "_" never occurs in a Kubernetes name, and nft's parser takes it in a chain name
// (it refuses "~"); the kernel takes names of up to 255 bytes.
func PolicyChainName(dir Direction, namespace, name string) string {
	prefix := "in/"
	if dir == Egress {
		prefix = "out/"
	}
	n := prefix + namespace + "/" + name
	if len(n) > 200 {
		n = n[:180] + "_" + shortHash(n)
	}
	return n
}

func groupName(dir Direction, chains []string) string {
	return "grp-" + string(dir) + "-" + shortHash(strings.Join(chains, "\n"))
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return b32.EncodeToString(sum[:8])[:12]
}

// DomainPattern is a domainNames entry as the DomainSets hold it: lower case, without the
// trailing dot (DNS names compare without case, and "example.com." is "example.com").
func DomainPattern(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// DomainSetName names the DomainSet of a pattern; identical patterns share one.
func DomainSetName(pattern string) string { return "dom-" + shortHash(pattern) }
