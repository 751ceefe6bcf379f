package cni

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLockWaitsAndTimesOut(t *testing.T) {
	t.Setenv("NETWARDEN_CNI_LOCK_DIR", t.TempDir())
	unlock, err := Lock(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, "p"); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("second Lock while held: %v, want ErrLockTimeout", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := Lock(context.Background(), "p")
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Lock after release: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return after the holder released it")
	}
}
