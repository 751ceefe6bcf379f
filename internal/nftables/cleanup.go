package nftables

import "context"

// CleanupLeftovers removes the table a backend left; nothing where nft does not work, since
// then no table of ours can be there either.
func CleanupLeftovers(ctx context.Context) error {
	b, err := New()
	if err != nil {
		return nil
	}
	return b.Cleanup(ctx)
}
