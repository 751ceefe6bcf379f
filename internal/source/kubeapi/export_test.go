package kubeapi

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CachedVersion returns the resourceVersion of the informer cache's object, or "".
func (s *Source) CachedVersion(resource, key string) string {
	for _, ni := range s.informers {
		if ni.resource == resource {
			if obj, ok, _ := ni.informer.GetIndexer().GetByKey(key); ok {
				return obj.(metav1.Object).GetResourceVersion()
			}
		}
	}
	return ""
}

// StatusSyncs returns how many looks at a ClusterNetworkPolicy's condition the Source took, and
// whether it has none queued or under way.
func (s *Source) StatusSyncs() (n int64, idle bool) {
	if s.cnp == nil || s.cnp.status == nil {
		return 0, true
	}
	sw := s.cnp.status
	return sw.syncs.Load(), sw.queue.Len() == 0 && !sw.busy.Load()
}
