package kubeapi

import (
	"context"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	npainformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"

	"github.com/netwarden/netwarden/internal/cluster"
)

const (
	// ClusterPolicyResource names ClusterNetworkPolicies in Revision.ResourceVersions.
	ClusterPolicyResource = "clusternetworkpolicies"
	// ClusterPolicyGroupVersion is the version of ClusterNetworkPolicies the Source watches.
	ClusterPolicyGroupVersion = "policy.networking.k8s.io/v1beta1"
	// DefaultCRDPollInterval is how often API discovery is asked whether the ClusterNetworkPolicy
	// CRD is served.
	DefaultCRDPollInterval = 10 * time.Second
)

// Option configures a Source.
type Option func(*options)

type options struct {
	npa             npaclient.Interface
	crdPollInterval time.Duration
	writeStatus     bool
}

// WithClusterNetworkPolicies makes the Source watch ClusterNetworkPolicies through client while
// their CRD is served. The CRD is optional: while API discovery does not list
// policy.networking.k8s.io/v1beta1 clusternetworkpolicies the Source says so once in its log,
// counts as synced without them and keeps delivering everything else; it asks discovery again
// every poll interval (WithCRDPollInterval), watches them once the CRD is served, and removes them
// all when it no longer is.
func WithClusterNetworkPolicies(client npaclient.Interface) Option {
	return func(o *options) { o.npa = client }
}

// WithCRDPollInterval sets how often API discovery is asked whether the ClusterNetworkPolicy CRD
// is served (DefaultCRDPollInterval when not positive).
func WithCRDPollInterval(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.crdPollInterval = d
		}
	}
}

// WithClusterPolicyStatus makes the Source write the condition ConditionAccepted on every
// ClusterNetworkPolicy, if RBAC lets it patch clusternetworkpolicies/status (asked once). It is
// for the agent; a one-off read of the cluster (render, explain) writes nothing.
func WithClusterPolicyStatus() Option {
	return func(o *options) { o.writeStatus = true }
}

// cnpWatcher follows the ClusterNetworkPolicy CRD's presence and runs an informer while it is
// served.
type cnpWatcher struct {
	s        *Source
	client   npaclient.Interface
	kube     kubernetes.Interface
	interval time.Duration
	status   *statusWriter // nil unless conditions are written

	// checked: discovery has answered once, so cur says whether the CRD is served.
	checked atomic.Bool
	cur     atomic.Pointer[cnpInformer]
}

// cnpInformer is the informer of one period during which the CRD is served.
type cnpInformer struct {
	cancel   context.CancelFunc
	factory  npainformers.SharedInformerFactory
	informer cache.SharedIndexInformer
	reg      cache.ResourceEventHandlerRegistration
	// refused: the API server refused to list ClusterNetworkPolicies (RBAC). The policies
	// cannot be known then, and the rest must still be enforced.
	refused atomic.Bool
}

func newCNPWatcher(s *Source, kube kubernetes.Interface, o options) *cnpWatcher {
	w := &cnpWatcher{s: s, client: o.npa, kube: kube, interval: o.crdPollInterval}
	if o.writeStatus {
		w.status = newStatusWriter(s.logger, o.npa, kube, w.cached)
	}
	return w
}

// synced reports whether the ClusterNetworkPolicies are known: discovery answered, and the CRD is
// not served, or its informer has synced (or was refused, which was logged).
func (w *cnpWatcher) synced() bool {
	if !w.checked.Load() {
		return false
	}
	in := w.cur.Load()
	return in == nil || in.reg.HasSynced() || in.refused.Load()
}

// cached returns the informer cache's ClusterNetworkPolicy name, if the CRD is served.
func (w *cnpWatcher) cached(name string) *npav1beta1.ClusterNetworkPolicy {
	in := w.cur.Load()
	if in == nil {
		return nil
	}
	obj, ok, _ := in.informer.GetIndexer().GetByKey(name)
	if !ok {
		return nil
	}
	cnp, _ := obj.(*npav1beta1.ClusterNetworkPolicy)
	return cnp
}

// run asks discovery whether the CRD is served, now and then every interval, and starts or stops
// the informer accordingly until ctx is done.
func (w *cnpWatcher) run(ctx context.Context, notify func()) {
	log := w.s.logger
	var absentLogged bool
	var lastErr string
	defer func() {
		if in := w.cur.Load(); in != nil {
			in.stop()
		}
	}()
	if w.status != nil {
		defer w.status.shutdown()
	}
	for {
		next := w.interval
		served, err := w.served(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("asking API discovery whether ClusterNetworkPolicies are served; asking again", "groupVersion", ClusterPolicyGroupVersion, "err", err)
				lastErr = err.Error()
			}
			if !w.checked.Load() {
				// The agent waits for this answer before its first sync.
				next = min(next, time.Second)
			}
		case served:
			lastErr, absentLogged = "", false
			if w.cur.Load() == nil {
				log.Info("ClusterNetworkPolicy CRD served; watching ClusterNetworkPolicies", "groupVersion", ClusterPolicyGroupVersion)
				if err := w.start(ctx, notify); err != nil {
					log.Error("watching ClusterNetworkPolicies", "err", err)
					break
				}
			}
			w.checked.Store(true)
		default:
			lastErr = ""
			if in := w.cur.Load(); in != nil {
				// Stopped before the policies are removed, so that no late event brings one back.
				in.stop()
				w.cur.Store(nil)
				n := w.s.objects.ClearClusterPolicies()
				log.Warn("ClusterNetworkPolicy CRD no longer served; its policies are no longer enforced", "removed", n)
				notify()
			}
			if !absentLogged {
				log.Info("ClusterNetworkPolicy CRD not installed (API discovery does not list "+ClusterPolicyGroupVersion+" clusternetworkpolicies); "+
					"enforcing everything else and looking for it again periodically", "interval", w.interval)
				absentLogged = true
			}
			w.checked.Store(true)
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// served asks API discovery whether policy.networking.k8s.io/v1beta1 serves
// clusternetworkpolicies. A group version that is not served answers 404.
func (w *cnpWatcher) served(ctx context.Context) (bool, error) {
	list := &metav1.APIResourceList{}
	rc := w.kube.Discovery().RESTClient()
	var err error
	if rc != nil {
		err = rc.Get().AbsPath("/apis/" + ClusterPolicyGroupVersion).Do(ctx).Into(list)
	} else {
		list, err = w.kube.Discovery().ServerResourcesForGroupVersion(ClusterPolicyGroupVersion)
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == ClusterPolicyResource {
			return true, nil
		}
	}
	return false, nil
}

// start runs a new informer for ClusterNetworkPolicies (a new factory each time: a stopped
// informer cannot run again).
func (w *cnpWatcher) start(ctx context.Context, notify func()) error {
	if w.status != nil {
		w.status.start(ctx)
	}
	ictx, cancel := context.WithCancel(ctx)
	factory := npainformers.NewSharedInformerFactoryWithOptions(w.client, 0, npainformers.WithTransform(Transform))
	informer := factory.Policy().V1beta1().ClusterNetworkPolicies().Informer()
	in := &cnpInformer{cancel: cancel, factory: factory, informer: informer}
	log := w.s.logger
	_ = informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			if in.refused.CompareAndSwap(false, true) {
				log.Error("not allowed to list or watch ClusterNetworkPolicies: they are NOT enforced until the agent's ClusterRole grants "+
					"get, list and watch on clusternetworkpolicies.policy.networking.k8s.io; enforcing everything else", "err", err)
			}
			return
		}
		w.s.watchError(ClusterPolicyResource, err)
	})
	ni := namedInformer{
		resource: ClusterPolicyResource,
		informer: informer,
		events:   handler(w.s, "ClusterNetworkPolicy", ClusterPolicyResource, cluster.ValidateClusterNetworkPolicy, w.s.objects.SetClusterPolicy),
	}
	if w.status != nil {
		ni.observe = w.status.observe
	}
	reg, err := w.s.addHandler(ni, notify)
	if err != nil {
		cancel()
		return err
	}
	in.reg = reg
	factory.Start(ictx.Done())
	w.cur.Store(in)
	return nil
}

// stop stops the informer and waits until its handlers have returned.
func (in *cnpInformer) stop() {
	in.cancel()
	in.factory.Shutdown()
}

// clusterPolicyCount is the number of valid ClusterNetworkPolicies held.
func (s *Source) clusterPolicyCount() int {
	if s.cnp == nil {
		return 0
	}
	return s.objects.ClusterPolicyCount()
}
