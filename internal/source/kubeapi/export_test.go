package kubeapi

// StatusSyncs returns how many looks at a ClusterNetworkPolicy's condition the Source took, and
// whether it has none queued or under way.
func (s *Source) StatusSyncs() (n int64, idle bool) {
	if s.cnp == nil || s.cnp.status == nil {
		return 0, true
	}
	sw := s.cnp.status
	return sw.syncs.Load(), sw.queue.Len() == 0 && !sw.busy.Load()
}
