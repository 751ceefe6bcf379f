package kubelet

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// statusLocked builds the pod status as the kubelet reports it.
func (p *podState) statusLocked() corev1.PodStatus {
	st := *p.pod.Status.DeepCopy() // keeps what others own (qosClass, nominatedNodeName, ...)
	st.ObservedGeneration = p.pod.Generation
	st.StartTime = &p.startTime
	st.Phase = p.phaseLocked()
	st.Reason, st.Message = "", ""
	st.HostIP, st.HostIPs = "", nil
	for i, ip := range p.d.cfg.NodeIPs {
		if i == 0 {
			st.HostIP = ip.String()
		}
		st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: ip.String()})
	}
	st.PodIP, st.PodIPs = "", nil
	if p.sb != nil {
		for i, ip := range p.sb.ips {
			if i == 0 {
				st.PodIP = ip.String()
			}
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
		}
	}

	st.InitContainerStatuses, st.ContainerStatuses = nil, nil
	var unready, uninit []string
	allReady := true
	for _, c := range p.containers {
		cs := corev1.ContainerStatus{
			Name:         c.spec.Name,
			Image:        c.spec.Image,
			State:        *c.state.DeepCopy(),
			Ready:        c.ready,
			RestartCount: c.restarts,
		}
		// The state before the current one: the previous instance's end while running or
		// terminated again, the latest end while waiting to restart.
		last := c.lastExit
		if c.state.Terminated != nil {
			last = c.prevExit
		}
		if last != nil {
			cs.LastTerminationState.Terminated = last.DeepCopy()
		}
		if c.unsupported == "" {
			cs.ImageID = p.d.agnhostImageID(c.spec.Image)
		}
		if c.id != "" {
			cs.ContainerID = containerIDPrefix + c.id
		}
		if w := cs.State.Waiting; w != nil && w.Reason == "ContainerCreating" && p.sbErr != "" {
			w.Message = p.sbErr // why the pod cannot start, as the kubelet's FailedMount/CNI events tell
		}
		started := c.started && c.state.Running != nil
		cs.Started = &started
		if c.init {
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
			if !c.succeeded && !(c.sidecar && started) {
				uninit = append(uninit, c.spec.Name)
			}
			if c.sidecar && !c.ready {
				allReady = false
				unready = append(unready, c.spec.Name)
			}
			continue
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !c.ready {
			allReady = false
			unready = append(unready, c.spec.Name)
		}
	}

	now := metav1.Now()
	setCond := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		s := corev1.ConditionFalse
		if ok {
			s, reason, msg = corev1.ConditionTrue, "", ""
		}
		old, had := p.conds[t]
		c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: p.pod.Generation, LastTransitionTime: now}
		if had && old.Status == s {
			c.LastTransitionTime = old.LastTransitionTime
		}
		p.conds[t] = c
	}
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	sandboxMsg := p.sbErr
	setCond(corev1.PodReadyToStartContainers, p.sbReady, "", sandboxMsg)
	initialized := p.initDone || len(uninit) == 0 && !p.initFailed
	setCond(corev1.PodInitialized, initialized, "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: %v", uninit))
	switch {
	case terminal:
		setCond(corev1.ContainersReady, false, "PodCompleted", "")
		setCond(corev1.PodReady, false, "PodCompleted", "")
	default:
		msg := fmt.Sprintf("containers with unready status: %v", unready)
		setCond(corev1.ContainersReady, allReady && initialized, "ContainersNotReady", msg)
		setCond(corev1.PodReady, allReady && initialized, "ContainersNotReady", msg)
	}
	setCond(corev1.PodScheduled, true, "", "")

	ours := map[corev1.PodConditionType]bool{}
	var conds []corev1.PodCondition
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		conds = append(conds, p.conds[t])
		ours[t] = true
	}
	for _, c := range st.Conditions {
		if !ours[c.Type] {
			conds = append(conds, c)
		}
	}
	st.Conditions = conds
	return st
}

// phaseLocked is the pod phase by the kubelet's rules.
func (p *podState) phaseLocked() corev1.PodPhase {
	if p.initFailed {
		return corev1.PodFailed
	}
	var running, waiting, succeeded, failed int
	for _, c := range p.containers {
		if c.init {
			continue
		}
		switch {
		case c.state.Running != nil:
			running++
		case c.state.Terminated != nil:
			if c.state.Terminated.ExitCode == 0 {
				succeeded++
			} else {
				failed++
			}
		case c.lastExit != nil: // waiting to restart
			if p.final {
				if c.lastExit.ExitCode == 0 {
					succeeded++
				} else {
					failed++
				}
			} else {
				running++ // restarting counts as running, as for the kubelet
			}
		default:
			waiting++
		}
	}
	if p.final {
		if failed == 0 && waiting == 0 && running == 0 && succeeded > 0 {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	}
	switch {
	case !p.initDone:
		return corev1.PodPending
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case succeeded+failed > 0:
		switch p.restartPolicy {
		case corev1.RestartPolicyAlways:
			return corev1.PodRunning
		case corev1.RestartPolicyOnFailure:
			if failed > 0 {
				return corev1.PodRunning
			}
			return corev1.PodSucceeded
		default:
			if failed > 0 {
				return corev1.PodFailed
			}
			return corev1.PodSucceeded
		}
	}
	return corev1.PodPending
}
