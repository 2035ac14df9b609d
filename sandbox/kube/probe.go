package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellbox/cellbox/sandbox/backend"
)

// Whether the cluster enforces NetworkPolicies is found out, not assumed:
// two pods of the agent image try a TCP connection to the API server's
// address, one of them under a policy that denies all egress. The open one
// must connect (else the probe says nothing, and nothing is trusted); the
// shut one must not. The answer is kept for the life of the process, per
// API server and namespace.

var probed sync.Map // host + "/" + namespace → probeResult

type probeResult struct {
	network, note string
	// gate is the address the probe found shut under deny-all, which a
	// box without network waits to find shut before its agent answers
	// (the enforcer programs a new pod's rules some time after it
	// starts); "" when the operator declared the policy enforced.
	gate string
}

// networkEnforcement is the Capabilities.Network of the cluster, with a
// sentence for logs and warnings.
func (b *Backend) networkEnforcement(ctx context.Context) probeResult {
	switch b.o.NetworkPolicy {
	case "enforced":
		return probeResult{network: backend.NetworkPolicy, note: "enforced: the operator says so (network policy probe off; a new box's first seconds, before the plugin programs its policy, are not checked)"}
	case "unenforced":
		return probeResult{network: backend.NetworkNone, note: "the cluster does not enforce NetworkPolicy (the operator says so): a box without network cannot be kept off it"}
	}
	key := b.rest.Host + "/" + b.ns
	if r, ok := probed.Load(key); ok {
		return r.(probeResult)
	}
	start := time.Now()
	enforced, why, err := b.probe(ctx)
	r := probeResult{network: backend.NetworkNone}
	switch {
	case err != nil:
		r.note = fmt.Sprintf("could not find out whether the cluster enforces NetworkPolicy (%v); a box without network cannot be made until it is known (fix the probe, or set CELLBOX_KUBE_NETWORK_POLICY=enforced if the cluster's network plugin enforces policies)", err)
	case !enforced:
		r.note = "the cluster's network plugin does not enforce NetworkPolicy: a pod under a deny-all policy " + why + "; boxes without network cannot be kept off it, so none is made (install a plugin that enforces policies: Calico, Cilium, kube-router, ...)"
	default:
		r = probeResult{network: backend.NetworkPolicy, note: fmt.Sprintf("enforced (probed in %s: %s)", time.Since(start).Round(time.Millisecond), why)}
		r.gate, _ = b.apiAddr()
	}
	if err == nil {
		probed.Store(key, r)
	}
	return r
}

// apiAddr is the API server's host:port, the address the probe tries.
func (b *Backend) apiAddr() (string, error) {
	u, err := url.Parse(b.rest.Host)
	if err != nil {
		return "", err
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "443"), nil
	}
	return u.Host, nil
}

// probe runs the two pods and reads their ends.
func (b *Backend) probe(ctx context.Context) (enforced bool, why string, err error) {
	target, err := b.apiAddr()
	if err != nil {
		return false, "", err
	}
	image := b.o.AgentImage
	if image == "" {
		if image, err = b.agentImage(b.o.AgentBinary); err != nil {
			return false, "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	suffix := make([]byte, 4)
	rand.Read(suffix)
	base := "cellbox-netprobe-" + hex.EncodeToString(suffix)
	open, shut := base+"-open", base+"-shut"
	defer func() {
		bg := context.WithoutCancel(ctx)
		zero := int64(0)
		for _, n := range []string{open, shut} {
			b.c.delete(bg, pods, n, &metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		b.c.delete(bg, policies, shut, &metav1.DeleteOptions{})
	}()
	deny := &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: shut},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelName: shut}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress},
		},
	}
	if err := b.c.create(ctx, policies, deny, &netv1.NetworkPolicy{}); err != nil {
		return false, "", fmt.Errorf("create the probe's policy: %w", err)
	}
	for _, n := range []string{open, shut} {
		if err := b.c.create(ctx, pods, b.probePod(n, image, target, n == shut), &corev1.Pod{}); err != nil {
			return false, "", fmt.Errorf("create probe pod %s: %w", n, err)
		}
	}
	ends := map[string]string{}
	for len(ends) < 2 {
		for _, n := range []string{open, shut} {
			if ends[n] != "" {
				continue
			}
			p, err := b.pod(ctx, n)
			if err != nil {
				return false, "", err
			}
			if p == nil {
				return false, "", fmt.Errorf("probe pod %s vanished", n)
			}
			switch p.Status.Phase {
			case corev1.PodSucceeded:
				ends[n] = "connected"
			case corev1.PodFailed:
				ends[n] = "refused"
			default:
				if st, why := b.podState(p); st != backend.StateRunning {
					return false, "", fmt.Errorf("probe pod %s: %s", n, why)
				}
			}
		}
		if len(ends) < 2 {
			select {
			case <-ctx.Done():
				return false, "", fmt.Errorf("the probe pods did not finish within %s: %w", probeTimeout, ctx.Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	if ends[open] != "connected" {
		return false, "", fmt.Errorf("a pod without a policy could not reach the API server's address %s either, so the probe cannot tell", target)
	}
	if ends[shut] == "connected" {
		return false, "kept reaching " + target + " for " + agentProbeFor, nil
	}
	return true, "a pod under a deny-all policy could not reach " + target + ", one without could", nil
}

// probeTimeout bounds the probe (two pods' start and a few seconds each).
const probeTimeout = 2 * time.Minute

// agentProbeFor is how long the shut probe pod keeps trying (agent.Probe).
const agentProbeFor = "45 s"

// probePod is a pod of the agent image that tries target: the open one
// until it connects, the shut one until a policy blocks it (a policy is
// in force some time after its pod appears: agent.Probe).
func (b *Backend) probePod(name, image, target string, shut bool) *corev1.Pod {
	cmd := []string{agentInImage, "agent", "--probe", target}
	if shut {
		cmd = append(cmd, "--probe-blocked")
	}
	no := false
	podSecurity, restricted := b.restricted()
	deadline := int64(110)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelName: name, "app.kubernetes.io/managed-by": "cellbox-probe"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no, EnableServiceLinks: &no,
			ActiveDeadlineSeconds: &deadline, NodeSelector: b.o.NodeSelector, Tolerations: b.o.Tolerations,
			SecurityContext: podSecurity,
			Containers: []corev1.Container{{
				Name: "probe", Image: image, ImagePullPolicy: b.o.PullPolicy,
				Command: cmd, SecurityContext: restricted,
			}},
		},
	}
}
