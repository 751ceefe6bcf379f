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
