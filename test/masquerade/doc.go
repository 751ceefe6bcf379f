// Package masquerade proves the agent's masquerade with packets on every backend.
package masquerade
