// Package deploy checks deploy/ against a real API server: the manifests pass server dry-run
// and the agent runs with exactly the rights they grant.
package deploy
