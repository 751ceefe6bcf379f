package kubeapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netwarden/netwarden/internal/cluster"
)

const (
	// ConditionAccepted is the type of the condition that the agents write on every
	// ClusterNetworkPolicy: True when it is valid and enforced, False (with the validation
	// error as message) when the agents ignore it.
	ConditionAccepted = "netwarden.io/Accepted"
	// ReasonValid and ReasonInvalid are the reasons of ConditionAccepted.
	ReasonValid   = "Valid"
	ReasonInvalid = "Invalid"

	statusFieldManager = "netwarden"
	// The CRD's limit on a condition's message.
	maxConditionMessage = 32768
)

// statusWriter writes ConditionAccepted on the ClusterNetworkPolicies. Every agent judges a
// policy the same way, so each patches only a condition that differs from its judgement, with
// the resourceVersion it judged as precondition: of the agents that see a change at once, one
// write succeeds and the others' conflict, after which they see the condition written. Nothing
// of enforcement waits for it or depends on it.
type statusWriter struct {
	logger *slog.Logger
	client npaclient.Interface
	kube   kubernetes.Interface
	// get returns the informer cache's policy of that name, or nil.
	get   func(name string) *npav1beta1.ClusterNetworkPolicy
	queue workqueue.TypedRateLimitingInterface[string]

	once    sync.Once
	allowed bool // RBAC lets the agent patch clusternetworkpolicies/status; set once, before any observe
	done    chan struct{}

	// For tests: looks taken, and whether one is under way.
	syncs atomic.Int64
	busy  atomic.Bool
}

func newStatusWriter(logger *slog.Logger, client npaclient.Interface, kube kubernetes.Interface, get func(string) *npav1beta1.ClusterNetworkPolicy) *statusWriter {
	return &statusWriter{logger: logger, client: client, kube: kube, get: get,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
}

// start asks, the first time only, whether the agent may patch the status, and starts the
// writer if it may. It runs before the informer that calls observe is started.
func (sw *statusWriter) start(ctx context.Context) {
	sw.once.Do(func() {
		sw.allowed = sw.mayPatch(ctx)
		if sw.allowed {
			sw.done = make(chan struct{})
			go sw.work(ctx)
		}
	})
}

// mayPatch asks the API server once whether the agent may patch clusternetworkpolicies/status.
func (sw *statusWriter) mayPatch(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	review, err := sw.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "patch", Group: npav1beta1.GroupName, Resource: ClusterPolicyResource, Subresource: "status",
		}},
	}, metav1.CreateOptions{})
	switch {
	case err != nil:
		sw.logger.Warn("cannot tell whether ClusterNetworkPolicy status may be written; not writing the "+ConditionAccepted+" condition", "err", err)
		return false
	case !review.Status.Allowed:
		sw.logger.Info("not allowed to patch clusternetworkpolicies/status; not writing the "+ConditionAccepted+" condition", "reason", review.Status.Reason)
		return false
	}
	sw.logger.Info("writing the " + ConditionAccepted + " condition on ClusterNetworkPolicies")
	return true
}

// observe queues a look at the condition of the policy obj.
func (sw *statusWriter) observe(obj any) {
	if cnp, ok := obj.(*npav1beta1.ClusterNetworkPolicy); ok && sw.allowed {
		sw.queue.Add(cnp.Name)
	}
}

// shutdown stops the writer and waits for it.
func (sw *statusWriter) shutdown() {
	sw.queue.ShutDown()
	if sw.done != nil {
		<-sw.done
	}
}

func (sw *statusWriter) work(ctx context.Context) {
	defer close(sw.done)
	for {
		name, quit := sw.queue.Get()
		if quit {
			return
		}
		sw.busy.Store(true)
		if err := sw.sync(ctx, name); err != nil {
			sw.queue.AddRateLimited(name)
		} else {
			sw.queue.Forget(name)
		}
		sw.syncs.Add(1)
		sw.busy.Store(false)
		sw.queue.Done(name)
	}
}

// AcceptedCondition is the condition ConditionAccepted that every agent computes for cnp.
func AcceptedCondition(cnp *npav1beta1.ClusterNetworkPolicy) metav1.Condition {
	c := metav1.Condition{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonValid,
		Message: "valid; enforced by netwarden", ObservedGeneration: cnp.Generation}
	if err := cluster.ClusterPolicyError(cnp); err != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonInvalid, err.Error()
		if len(c.Message) > maxConditionMessage {
			c.Message = c.Message[:maxConditionMessage-3] + "..."
		}
	}
	return c
}

// sync patches the condition of the policy name when it differs from the agent's judgement. It
// returns an error only for a failure worth retrying.
func (sw *statusWriter) sync(ctx context.Context, name string) error {
	cnp := sw.get(name)
	if cnp == nil {
		return nil
	}
	want := AcceptedCondition(cnp)
	if cur := meta.FindStatusCondition(cnp.Status.Conditions, ConditionAccepted); cur != nil && cur.Status == want.Status &&
		cur.Reason == want.Reason && cur.Message == want.Message && cur.ObservedGeneration == want.ObservedGeneration {
		return nil
	}
	// A merge patch replaces the whole list: the others' conditions go in as they are, and the
	// resourceVersion precondition makes sure none was added meanwhile.
	conds := slices.Clone(cnp.Status.Conditions)
	meta.SetStatusCondition(&conds, want)
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": cnp.ResourceVersion},
		"status":   map[string]any{"conditions": conds},
	})
	if err != nil {
		return nil // cannot happen
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = sw.client.PolicyV1beta1().ClusterNetworkPolicies().Patch(pctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: statusFieldManager}, "status")
	switch {
	case err == nil:
		sw.logger.Debug("ClusterNetworkPolicy condition written", "name", name, "type", ConditionAccepted, "status", want.Status, "generation", want.ObservedGeneration)
		return nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		// Another agent wrote first, or the policy changed or went away: its event comes.
		return nil
	case ctx.Err() != nil:
		return nil
	}
	sw.logger.Warn("writing the ClusterNetworkPolicy condition; retrying", "name", name, "type", ConditionAccepted, "err", err)
	return err
}
