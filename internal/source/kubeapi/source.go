// Package kubeapi provides cluster state from the Kubernetes API through client-go shared informers,
// and for pods a reflector that feeds the Tracker directly (see podFeed).
//
// Objects are stripped to the fields the agent uses and defaulted as they arrive (see Transform).
// The event handlers validate each object once, and keep the valid ones in a cluster.Tracker, so
// a Snapshot copies only the maps of the kinds that changed and lists the changed keys. The
// objects are shared by the informer caches, the Tracker and every snapshot: they must never be
// modified.
package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Source is a cluster.Source backed by shared informers for Namespaces, NetworkPolicies and
// Nodes, a reflector for Pods, and, when given a client for them (WithClusterNetworkPolicies), ClusterNetworkPolicies
// while their CRD is served.
type Source struct {
	logger *slog.Logger
	// factory holds the informers of namespaces, policies and nodes.
	factory   informers.SharedInformerFactory
	informers []namedInformer
	// pods go from their reflector straight into objects (see podFeed).
	pods         *podFeed
	podReflector *cache.Reflector
	// cnp watches ClusterNetworkPolicies; nil when the Source has no client for them.
	cnp *cnpWatcher

	running atomic.Bool
	regs    atomic.Pointer[[]cache.ResourceEventHandlerRegistration]

	// objects holds the valid objects as the event handlers deliver them. Each snapshot lists
	// the keys changed since the one before, so the compiler looks only at those.
	objects *cluster.Tracker
}

type namedInformer struct {
	resource string
	informer cache.SharedIndexInformer
	events   kindHandler
	// observe, when set, is called with the object of every add and update, changed or not.
	observe func(obj any)
}

// kindHandler keeps the Tracker in step with one informer's events.
type kindHandler struct {
	upsert func(obj any)
	remove func(obj any)
	// seen records the resourceVersion of an event's object, changed or not, so that the
	// applied Revision covers every write a client made (see cluster.Revision).
	seen func(obj any)
}

// handler validates each object of one kind as it arrives: a valid one replaces the key's
// entry, an invalid one is logged (once per version, as events come once) and removes it.
func handler[T any, PT interface {
	*T
	metav1.Object
}](s *Source, kind, resource string, validate func(PT) field.ErrorList, set func(key string, obj PT)) kindHandler {
	key := func(obj PT) string {
		if obj.GetNamespace() != "" {
			return cluster.Key(obj.GetNamespace(), obj.GetName())
		}
		return obj.GetName()
	}
	return kindHandler{
		upsert: func(o any) {
			if inv, ok := o.(*invalidObject); ok {
				k := key(inv.Object.(PT))
				s.logger.Error("ignoring invalid object from the Kubernetes API", "kind", kind, "key", k, "errors", inv.errs.ToAggregate().Error(),
					"err", &cluster.InvalidError{Kind: kind, Key: k, Errs: inv.errs})
				set(k, nil)
				return
			}
			obj, ok := o.(PT)
			if !ok {
				return
			}
			if errs := validate(obj); len(errs) > 0 {
				s.logger.Error("ignoring invalid object from the Kubernetes API", "kind", kind, "key", key(obj), "errors", errs.ToAggregate().Error(),
					"err", &cluster.InvalidError{Kind: kind, Key: key(obj), Errs: errs})
				set(key(obj), nil)
				return
			}
			set(key(obj), obj)
		},
		remove: func(o any) {
			switch obj := o.(type) {
			case PT:
				set(key(obj), nil)
			case *invalidObject:
				set(key(obj.Object.(PT)), nil)
			case cache.DeletedFinalStateUnknown:
				// The watch missed the delete; the tombstone's key is namespace/name, as ours.
				set(obj.Key, nil)
			}
		},
		seen: func(o any) {
			// A delete's object carries the resourceVersion of the delete itself; a
			// tombstone carries none, and the next event of the resource moves it on.
			if inv, ok := o.(*invalidObject); ok {
				o = inv.Object
			}
			if obj, ok := o.(PT); ok {
				s.objects.SeenResourceVersion(resource, cluster.ParseResourceVersion(obj.GetResourceVersion()))
			}
		},
	}
}

// PodFieldSelector is what the Source asks of pods: those a policy can select or name. A pod
// of the node's network (hostNetwork) has the node's addresses, and a finished one (Succeeded,
// Failed) has given its address up; the agent judges neither, so the API server sends neither,
// and a pod that finishes is deleted from the watch. At 150,000 pods every node's agent
// receives each such pod's changes otherwise.
const PodFieldSelector = "spec.hostNetwork=false,status.phase!=Succeeded,status.phase!=Failed"

var (
	_ cluster.Source     = (*Source)(nil)
	_ cluster.NodeLister = (*Source)(nil)
)

// New returns a Source that lists and watches through client. Nothing is requested until Run.
func New(client kubernetes.Interface, logger *slog.Logger, opts ...Option) *Source {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	o := options{crdPollInterval: DefaultCRDPollInterval}
	for _, opt := range opts {
		opt(&o)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(Transform))
	s := &Source{logger: logger, factory: factory, objects: cluster.NewTracker()}
	// Only the pods a policy can select or name are asked for (PodFieldSelector): the others
	// are never sent.
	s.pods = newPodFeed(handler(s, "Pod", "pods", func(*cluster.Pod) field.ErrorList { return nil }, s.objects.SetPod), s.objects) // validated by TransformPod
	s.podReflector = newPodReflector(client, s.pods, func(err error) { s.watchError("pods", err) })
	s.informers = []namedInformer{
		{"namespaces", factory.Core().V1().Namespaces().Informer(),
			handler(s, "Namespace", "namespaces", cluster.ValidateNamespace, s.objects.SetNamespace), nil},
		{"networkpolicies", factory.Networking().V1().NetworkPolicies().Informer(),
			handler(s, "NetworkPolicy", "networkpolicies", cluster.ValidateNetworkPolicy, s.objects.SetPolicy), nil},
		{"nodes", factory.Core().V1().Nodes().Informer(),
			handler(s, "Node", "nodes", cluster.ValidateNode, s.objects.SetNode), nil},
	}
	for _, ni := range s.informers {
		resource := ni.resource
		// Cannot fail before the informer is started.
		_ = ni.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			s.watchError(resource, err)
		})
	}
	if o.npa != nil {
		s.cnp = newCNPWatcher(s, client, o)
	}
	return s
}

// watchError logs a failed list or watch of resource, which the informer retries.
func (s *Source) watchError(resource string, err error) {
	switch {
	case errors.Is(err, io.EOF):
		// The watch was closed normally; the informer watches again.
	case errors.Is(err, io.ErrUnexpectedEOF), apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		s.logger.Debug("kubernetes watch closed; relisting", "resource", resource, "err", err)
	default:
		s.logger.Warn("kubernetes list/watch failed; retrying", "resource", resource, "err", err)
	}
}

// addHandler registers the event handlers of ni, which keep the Tracker in step with it.
func (s *Source) addHandler(ni namedInformer, notify func()) (cache.ResourceEventHandlerRegistration, error) {
	ev, observe := ni.events, ni.observe
	if observe == nil {
		observe = func(any) {}
	}
	reg, err := ni.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Every event notifies, even one that changes nothing the agent keeps: its
		// resourceVersion is part of the next snapshot's Revision, which the agent reports
		// as applied once synced. Such a sync compiles no change and writes nothing.
		AddFunc: func(obj any) {
			ev.upsert(obj)
			ev.seen(obj)
			observe(obj)
			notify()
		},
		UpdateFunc: func(oldObj, newObj any) {
			// An update of nothing we keep leaves the old object in place, so the
			// compiler sees no change at all.
			if !unchanged(oldObj, newObj) {
				ev.upsert(newObj)
			}
			ev.seen(newObj)
			observe(newObj)
			notify()
		},
		DeleteFunc: func(obj any) {
			ev.remove(obj)
			ev.seen(obj)
			notify()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kubeapi source: adding %s event handler: %w", ni.resource, err)
	}
	return reg, nil
}

// Run starts the informers, calls notify after every add, update and delete (updates that change
// none of the kept fields excepted) and once more when all caches have synced, and blocks until ctx
// is done. It returns nil then. With a client for ClusterNetworkPolicies it also asks API
// discovery, at start and then every poll interval, whether their CRD is served, and watches them
// while it is (see WithClusterNetworkPolicies).
func (s *Source) Run(ctx context.Context, notify func()) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("kubeapi source: Run called twice")
	}
	regs := make([]cache.ResourceEventHandlerRegistration, 0, len(s.informers))
	synced := make([]cache.InformerSynced, 0, len(s.informers)+1)
	for _, ni := range s.informers {
		reg, err := s.addHandler(ni, notify)
		if err != nil {
			return err
		}
		regs = append(regs, reg)
		synced = append(synced, reg.HasSynced)
	}
	s.regs.Store(&regs)

	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	s.pods.notify = notify
	podsDone := make(chan struct{})
	go func() {
		defer close(podsDone)
		// Its failures to list or watch are logged as the informers' are (podListWatch); what
		// the reflector itself would log of them, once more and in klog's words, is dropped.
		s.podReflector.RunWithContext(klog.NewContext(ctx, logr.Discard()))
	}()
	defer func() { <-podsDone }()
	synced = append(synced, s.pods.synced.Load)
	if s.cnp != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.cnp.run(ctx, notify)
		}()
		defer func() { <-done }()
		synced = append(synced, s.cnp.synced)
	}
	s.logger.Info("waiting for kubernetes caches to sync")
	if cache.WaitForCacheSync(ctx.Done(), synced...) {
		nss, pods, policies, nodes := s.objects.Counts()
		s.logger.Info("kubernetes caches synced", "namespaces", nss, "pods", pods, "policies", policies, "nodes", nodes,
			"clusterPolicies", s.clusterPolicyCount())
		notify()
	}
	<-ctx.Done()
	return nil
}

// unchanged reports whether an update changed nothing but the resourceVersion of an object (after
// Transform, e.g. a pod condition or node heartbeat changed).
func unchanged(oldObj, newObj any) bool {
	switch n := newObj.(type) {
	case *cluster.Pod:
		o, ok := oldObj.(*cluster.Pod)
		return ok && o.EqualIgnoringResourceVersion(n)
	case *invalidObject:
		// A pod that stays invalid for the same reasons (a status update, say) is not logged
		// again.
		o, ok := oldObj.(*invalidObject)
		if !ok {
			return false
		}
		op, ok1 := o.Object.(*cluster.Pod)
		np, ok2 := n.Object.(*cluster.Pod)
		return ok1 && ok2 && op.EqualIgnoringResourceVersion(np) && o.errs.ToAggregate().Error() == n.errs.ToAggregate().Error()
	case *corev1.Namespace:
		o, ok := oldObj.(*corev1.Namespace)
		return ok && equalIgnoringResourceVersion(o, n)
	case *networkingv1.NetworkPolicy:
		o, ok := oldObj.(*networkingv1.NetworkPolicy)
		return ok && equalIgnoringResourceVersion(o, n)
	case *corev1.Node:
		o, ok := oldObj.(*corev1.Node)
		return ok && equalIgnoringResourceVersion(o, n)
	case *npav1beta1.ClusterNetworkPolicy:
		o, ok := oldObj.(*npav1beta1.ClusterNetworkPolicy)
		if !ok {
			return false
		}
		// The status is kept for the conditions writer alone (see clusterPolicyStatus): the
		// agents' own condition writes must not make the compiler look at the policy again.
		x, y := *o, *n
		x.Status, y.Status = npav1beta1.ClusterNetworkPolicyStatus{}, npav1beta1.ClusterNetworkPolicyStatus{}
		return equalIgnoringResourceVersion(&x, &y)
	}
	return false
}

func equalIgnoringResourceVersion[T any, PT interface {
	*T
	metav1.Object
}](a, b PT) bool {
	if a == b {
		return true
	}
	x, y := *a, *b // shallow copies; only the resourceVersion string is changed
	PT(&x).SetResourceVersion("")
	PT(&y).SetResourceVersion("")
	return equality.Semantic.DeepEqual(&x, &y)
}

// HasSynced reports whether the informers of namespaces, policies and nodes have synced and
// their initial objects have been delivered to the event handlers, whether the first list of
// pods has been delivered, and, with a client for ClusterNetworkPolicies, whether API
// discovery has said if their CRD is served and, when it is, their informer has synced too. It is
// false before Run.
func (s *Source) HasSynced() bool {
	regs := s.regs.Load()
	if regs == nil {
		return false
	}
	for _, r := range *regs {
		if !r.HasSynced() {
			return false
		}
	}
	return s.pods.synced.Load() && (s.cnp == nil || s.cnp.synced())
}

// Snapshot returns the valid objects delivered so far. The objects are those the informers
// cache and the Tracker holds (already stripped and defaulted by Transform), not copies: they must not be modified. An object that
// fails validation was logged when it arrived and is left out.
func (s *Source) Snapshot() *cluster.State { return s.objects.Snapshot() }

// Nodes implements cluster.NodeLister.
func (s *Source) Nodes() (map[string]*corev1.Node, cluster.Revision) { return s.objects.Nodes() }
