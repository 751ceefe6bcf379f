package kubeapi

import (
	"context"
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/netwarden/netwarden/internal/cluster"
)

// podFeed is the store of the pod watch's reflector, and keeps no pod of its own: each event
// goes through Transform and the pod handler straight into the Tracker, and a list replaces
// what the Tracker holds. A shared informer would hold every pod once more in its index (some
// 13.5 MB at 150,000 pods), queue each event in a DeltaFIFO and again for each handler, and
// hold the whole first list as queued notifications. Only the reflector's goroutine calls it.
type podFeed struct {
	events  kindHandler
	objects *cluster.Tracker
	notify  func()
	// invalid holds the pods that failed validation, by key: the Tracker has none of them,
	// and an update that leaves one invalid for the same reasons is not logged again.
	invalid map[string]*invalidObject
	synced  atomic.Bool
}

var _ cache.TransformingStore = (*podFeed)(nil)

func newPodFeed(events kindHandler, objects *cluster.Tracker) *podFeed {
	return &podFeed{events: events, objects: objects, notify: func() {}, invalid: map[string]*invalidObject{}}
}

// podListWatch lists and watches the pods a policy can select or name (PodFieldSelector), with
// the streaming first list (WatchList) where the client and server have it, as client-go's
// own pod informer does. failed is told of every list or watch that could not start: a
// reflector, unlike an informer, takes no handler of its own for them.
func podListWatch(client kubernetes.Interface, failed func(error)) cache.ListerWatcher {
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = PodFieldSelector
			l, err := pods.List(ctx, o)
			if err != nil {
				failed(err)
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = PodFieldSelector
			w, err := pods.Watch(ctx, o)
			if err != nil {
				failed(err)
			}
			return w, err
		},
	}, client)
}

// newPodReflector returns the reflector that keeps feed in step with the API server's pods;
// failed is told of the lists and watches that could not start.
func newPodReflector(client kubernetes.Interface, feed *podFeed, failed func(error)) *cache.Reflector {
	return cache.NewReflectorWithOptions(podListWatch(client, failed), &corev1.Pod{}, feed,
		cache.ReflectorOptions{Name: "pods", TypeDescription: "*v1.Pod"})
}

// Transformer has the reflector keep the objects of a streamed first list as Transform leaves
// them, not whole, until it hands the list over.
func (f *podFeed) Transformer() cache.TransformFunc { return Transform }

func (f *podFeed) Add(obj any) error    { return f.update(obj) }
func (f *podFeed) Update(obj any) error { return f.update(obj) }
func (f *podFeed) Resync() error        { return nil }

func (f *podFeed) update(obj any) error {
	o, key, err := transformPod(obj)
	if err != nil {
		return err
	}
	f.put(key, o)
	f.events.seen(o)
	f.notify()
	return nil
}

// put stores one transformed pod unless it changed nothing the agent keeps.
func (f *podFeed) put(key string, o any) {
	if prev := f.previous(key); prev == nil || !unchanged(prev, o) {
		f.events.upsert(o)
	}
	if inv, ok := o.(*invalidObject); ok {
		f.invalid[key] = inv
	} else {
		delete(f.invalid, key)
	}
}

// previous is the version of key that the last event left: a pod, an invalid pod, or nil.
func (f *podFeed) previous(key string) any {
	if inv := f.invalid[key]; inv != nil {
		return inv
	}
	if p := f.objects.Pod(key); p != nil {
		return p
	}
	return nil
}

func (f *podFeed) Delete(obj any) error {
	o, key, err := transformPod(obj)
	if err != nil {
		return err
	}
	delete(f.invalid, key)
	f.events.remove(o)
	f.events.seen(o)
	f.notify()
	return nil
}

// Replace makes list the pods: the first list, or a list again after the watch fell behind
// what the API server keeps. Pods the Tracker holds that the list lacks were deleted meanwhile.
func (f *podFeed) Replace(list []any, resourceVersion string) error {
	listed := make(map[string]struct{}, len(list))
	for _, obj := range list {
		o, key, err := transformPod(obj)
		if err != nil {
			return err
		}
		listed[key] = struct{}{}
		f.put(key, o)
	}
	for _, key := range f.objects.PodKeys() {
		if _, ok := listed[key]; !ok {
			f.events.remove(cache.DeletedFinalStateUnknown{Key: key})
		}
	}
	for key := range f.invalid {
		if _, ok := listed[key]; !ok {
			delete(f.invalid, key)
		}
	}
	f.objects.SeenResourceVersion("pods", cluster.ParseResourceVersion(resourceVersion))
	f.synced.Store(true)
	f.notify()
	return nil
}

// transformPod returns obj as Transform leaves a pod (a *cluster.Pod, or an *invalidObject
// holding one) and its key.
func transformPod(obj any) (any, string, error) {
	o, err := Transform(obj)
	if err != nil {
		return nil, "", err
	}
	switch p := o.(type) {
	case *cluster.Pod:
		return o, p.Key(), nil
	case *invalidObject:
		if pod, ok := p.Object.(*cluster.Pod); ok {
			return o, pod.Key(), nil
		}
	}
	return nil, "", fmt.Errorf("kubeapi: the pod watch delivered a %T", obj)
}
