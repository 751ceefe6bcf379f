// Package command runs the kernel tools the backends drive (nft, iptables, ipset) and turns a
// failure into an error that says what ran and what the tool printed, because those messages
// ("Set cannot be destroyed: it is in use", a restore's failing line) are what an operator needs.
package command

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Run runs name with args, feeding stdin when it is not nil, and returns its standard output.
// A failure's error reads "name args: <the tool's standard error>".
func Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Start()
	if err == nil {
		started(cmd.Process.Pid, name)
		err = cmd.Wait()
		finished(cmd.Process.Pid)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), msg)
	}
	return stdout.Bytes(), nil
}
