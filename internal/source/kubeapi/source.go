// Package kubeapi provides cluster state from the Kubernetes API through client-go shared informers.
//
// Objects are stripped to the fields the agent uses and defaulted as they enter the informer caches
// (see Transform), so a Snapshot only copies pointers to the cached objects. Those objects are
// shared by the caches and every snapshot: they must never be modified.
package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netwarden/netwarden/internal/cluster"
)

// Source is a cluster.Source backed by shared informers for Namespaces, Pods, NetworkPolicies and
// Nodes.
type Source struct {
	logger    *slog.Logger
	factory   informers.SharedInformerFactory
	informers []namedInformer

	namespaces corelisters.NamespaceLister
	pods       corelisters.PodLister
	policies   networkinglisters.NetworkPolicyLister
	nodes      corelisters.NodeLister

	running atomic.Bool
	regs    atomic.Pointer[[]cache.ResourceEventHandlerRegistration]

	// Validation verdicts by object pointer: cached objects are immutable and replaced on every
	// change, so an object is validated (and, if invalid, logged) once, not on every Snapshot.
	mu       sync.Mutex
	nsOK     map[*corev1.Namespace]bool
	podOK    map[*corev1.Pod]bool
	policyOK map[*networkingv1.NetworkPolicy]bool
	nodeOK   map[*corev1.Node]bool
}

type namedInformer struct {
	resource string
	informer cache.SharedIndexInformer
}

var _ cluster.Source = (*Source)(nil)

// New returns a Source that lists and watches through client. Nothing is requested until Run.
func New(client kubernetes.Interface, logger *slog.Logger) *Source {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(Transform))
	s := &Source{
		logger:     logger,
		factory:    factory,
		namespaces: factory.Core().V1().Namespaces().Lister(),
		pods:       factory.Core().V1().Pods().Lister(),
		policies:   factory.Networking().V1().NetworkPolicies().Lister(),
		nodes:      factory.Core().V1().Nodes().Lister(),
	}
	s.informers = []namedInformer{
		{"namespaces", factory.Core().V1().Namespaces().Informer()},
		{"pods", factory.Core().V1().Pods().Informer()},
		{"networkpolicies", factory.Networking().V1().NetworkPolicies().Informer()},
		{"nodes", factory.Core().V1().Nodes().Informer()},
	}
	for _, ni := range s.informers {
		resource := ni.resource
		// Cannot fail before the informer is started.
		_ = ni.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			switch {
			case errors.Is(err, io.EOF):
				// The watch was closed normally; the informer watches again.
			case errors.Is(err, io.ErrUnexpectedEOF), apierrors.IsResourceExpired(err), apierrors.IsGone(err):
				logger.Debug("kubernetes watch closed; relisting", "resource", resource, "err", err)
			default:
				logger.Warn("kubernetes list/watch failed; retrying", "resource", resource, "err", err)
			}
		})
	}
	return s
}

// Run starts the informers, calls notify after every add, update and delete (updates that change
// none of the kept fields excepted) and once more when all caches have synced, and blocks until ctx
// is done. It returns nil then.
func (s *Source) Run(ctx context.Context, notify func()) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("kubeapi source: Run called twice")
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { notify() },
		UpdateFunc: func(oldObj, newObj any) {
			if !unchanged(oldObj, newObj) {
				notify()
			}
		},
		DeleteFunc: func(any) { notify() },
	}
	regs := make([]cache.ResourceEventHandlerRegistration, 0, len(s.informers))
	synced := make([]cache.InformerSynced, 0, len(s.informers))
	for _, ni := range s.informers {
		reg, err := ni.informer.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("kubeapi source: adding %s event handler: %w", ni.resource, err)
		}
		regs = append(regs, reg)
		synced = append(synced, reg.HasSynced)
	}
	s.regs.Store(&regs)

	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	s.logger.Info("waiting for kubernetes caches to sync")
	if cache.WaitForCacheSync(ctx.Done(), synced...) {
		st := s.Snapshot()
		s.logger.Info("kubernetes caches synced", "namespaces", len(st.Namespaces), "pods", len(st.Pods),
			"policies", len(st.Policies), "nodes", len(st.Nodes))
		notify()
	}
	<-ctx.Done()
	return nil
}

// unchanged reports whether an update changed nothing but the resourceVersion of an object (after
// Transform, e.g. a pod condition or node heartbeat changed).
func unchanged(oldObj, newObj any) bool {
	switch n := newObj.(type) {
	case *corev1.Pod:
		o, ok := oldObj.(*corev1.Pod)
		return ok && equalIgnoringResourceVersion(o, n)
	case *corev1.Namespace:
		o, ok := oldObj.(*corev1.Namespace)
		return ok && equalIgnoringResourceVersion(o, n)
	case *networkingv1.NetworkPolicy:
		o, ok := oldObj.(*networkingv1.NetworkPolicy)
		return ok && equalIgnoringResourceVersion(o, n)
	case *corev1.Node:
		o, ok := oldObj.(*corev1.Node)
		return ok && equalIgnoringResourceVersion(o, n)
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

// HasSynced reports whether all four informers have synced and their initial objects have been
// delivered to the event handlers. It is false before Run.
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
	return true
}

// Snapshot returns the current contents of the informer caches. The objects are the cached ones
// (already stripped and defaulted by Transform), not copies: they must not be modified. An object
// that fails validation is logged once and left out.
func (s *Source) Snapshot() *cluster.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := cluster.NewState()
	namespaces, _ := s.namespaces.List(labels.Everything())
	pods, _ := s.pods.List(labels.Everything())
	policies, _ := s.policies.List(labels.Everything())
	nodes, _ := s.nodes.List(labels.Everything())
	s.nsOK = collect(s, "Namespace", namespaces, s.nsOK, cluster.ValidateNamespace, st.Namespaces)
	s.podOK = collect(s, "Pod", pods, s.podOK, cluster.ValidatePod, st.Pods)
	s.policyOK = collect(s, "NetworkPolicy", policies, s.policyOK, cluster.ValidateNetworkPolicy, st.Policies)
	s.nodeOK = collect(s, "Node", nodes, s.nodeOK, cluster.ValidateNode, st.Nodes)
	return st
}

// Nodes implements cluster.NodeLister.
func (s *Source) Nodes() map[string]*corev1.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*corev1.Node{}
	nodes, _ := s.nodes.List(labels.Everything())
	s.nodeOK = collect(s, "Node", nodes, s.nodeOK, cluster.ValidateNode, out)
	return out
}

// collect puts the valid objects of list into out and returns the validation verdicts of the
// objects in list, reusing those of prev.
func collect[T any, PT interface {
	*T
	metav1.Object
}](s *Source, kind string, list []PT, prev map[PT]bool, validate func(PT) field.ErrorList, out map[string]PT) map[PT]bool {
	verdicts := make(map[PT]bool, len(list))
	for _, obj := range list {
		key := obj.GetName()
		if obj.GetNamespace() != "" {
			key = cluster.Key(obj.GetNamespace(), obj.GetName())
		}
		ok, known := prev[obj]
		if !known {
			errs := validate(obj)
			ok = len(errs) == 0
			if !ok {
				s.logger.Error("ignoring invalid object from the Kubernetes API", "kind", kind, "key", key, "errors", errs.ToAggregate().Error())
			}
		}
		verdicts[obj] = ok
		if ok {
			out[key] = obj
		}
	}
	return verdicts
}
