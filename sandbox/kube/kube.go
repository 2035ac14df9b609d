// Package kube is the Backend of boxes as pods on a Kubernetes cluster
// (client-go; the server's kubeconfig or its in-cluster config). The
// cluster schedules them; cellbox only asks.
//
// A box is three objects of the backend's namespace, named after the box:
//
//   - a Secret: the box's record (its labels and spec, which Start reads
//     to make a pod) and its token, the secret every connection to its
//     agent opens with. The Secret is the box: it lives from Create to
//     Remove, and the pod and policy are owned by it (deleting it deletes
//     them).
//   - a NetworkPolicy selecting the pod: all ingress denied; egress
//     denied unless Spec.Network. A cluster whose network plugin does not
//     enforce policies is found out at New (a probe) and said
//     (Capabilities.Network is NetworkPolicy where it does; NetworkNone,
//     and boxes without network refused, not trusted to a policy nobody
//     enforces, where it does not).
//   - a Pod while the box runs: an init container of the agent image
//     (cellbox/agent:DIGEST, the static cellbox binary alone) copies the
//     agent into an emptyDir, and the box container of the box's image
//     runs it as PID 1. The restricted Pod Security Standard in full:
//     non-root (backend.BoxUID), every capability dropped, no privilege
//     escalation, seccomp RuntimeDefault (or a Localhost profile), a
//     read-only root, no service-account token. /workspace and /tmp are
//     emptyDirs with Limits.DiskBytes as their size limit.
//
// Stop keeps the workspace without keeping the pod: the agent's tar of
// /workspace goes to the Keeper, the pod is deleted and its node freed;
// Start makes a pod on whichever node the scheduler picks and writes the
// kept tar back. A pod that dies without a Stop (evicted, its node dead)
// comes back the same way from the last kept copy, and Info.Lost says
// what is gone.
package kube

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Options configure New.
type Options struct {
	// Kubeconfig is the kubeconfig file; "" uses the in-cluster config
	// when the server runs in a pod, else $KUBECONFIG or ~/.kube/config,
	// as kubectl does. Context picks a context of it ("": the current).
	Kubeconfig, Context string
	// Namespace holds the boxes; it must exist (DefaultNamespace).
	Namespace string
	// DefaultImage is the image of a box of backend.DefaultImage
	// (DefaultImage's default): it must be on the nodes or in a registry
	// they pull from.
	DefaultImage string
	// AgentImage is the image whose /cellbox the init container copies
	// into the box; "" is backend.AgentImage(Spec.AgentBinary), the image
	// `cellbox image agent --oci FILE` writes.
	AgentImage string
	// PullPolicy of both images; "" is IfNotPresent.
	PullPolicy corev1.PullPolicy
	// NodeSelector, Tolerations and RuntimeClass (gVisor, Kata) go into
	// every box's pod as given.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	RuntimeClass string
	// SeccompLocalhost names a seccomp profile on the nodes (relative to
	// the kubelet's seccomp directory); "" is RuntimeDefault.
	SeccompLocalhost string
	// NetworkPolicy says how New learns whether the cluster enforces
	// NetworkPolicies: "" or "probe" (two short-lived pods try the API
	// server, one under a deny-all policy), "enforced" (the operator says
	// so), "unenforced".
	NetworkPolicy string
	// AgentBinary is the static cellbox binary boxes run (the probe's
	// pods use its image); "" is this process's own binary.
	AgentBinary string
	// Keeper keeps stopped boxes' workspaces (required).
	Keeper backend.Keeper
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultNamespace = "cellbox"
	DefaultImage     = "cellbox/base"
	// agentPort is where the agent listens, on the pod's loopback only.
	agentPort = 7070
	// keptMark is the Secret annotation of the last Put to the Keeper.
	annKept    = "cellbox.dev/kept"
	annLabels  = "cellbox.dev/labels"
	annSpec    = "cellbox.dev/spec"
	annAvoid   = "cellbox.dev/avoid-node"
	annStopped = "cellbox.dev/stopped"
	annLost    = "cellbox.dev/lost"
	keyToken   = "token"
	labelName  = "cellbox.dev/box" // on every object: the box's object name
)

// Backend is the kubernetes backend.
type Backend struct {
	c    *client
	rest *rest.Config
	ns   string
	o    Options
	log  *slog.Logger
	caps backend.Capabilities
	gate string // probeResult.gate

	fw     forwarders
	tokMu  sync.Mutex
	tokens map[string]string // object name → token

	keepMu  sync.Mutex
	keeping map[string]*sync.Mutex // box id → its keep's lock (see keep)
}

var _ backend.Backend = (*Backend)(nil)

// New connects to the cluster, checks the namespace and finds out what it
// enforces.
func New(ctx context.Context, o Options) (*Backend, error) {
	if o.Keeper == nil {
		return nil, errors.New("kubernetes backend: no Keeper for stopped boxes' workspaces")
	}
	cfg, err := restConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200 // a box is a few requests; the defaults (5, 10) throttle a storm
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	c, err := newClient(cfg, o.Namespace)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	if o.DefaultImage == "" {
		o.DefaultImage = DefaultImage
	}
	if o.PullPolicy == "" {
		o.PullPolicy = corev1.PullIfNotPresent
	}
	if o.AgentBinary == "" && o.AgentImage == "" {
		if o.AgentBinary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("kubernetes backend: the agent binary: %w", err)
		}
	}
	b := &Backend{c: c, rest: cfg, ns: o.Namespace, o: o, log: o.Logger,
		fw: forwarders{m: map[string]*forwarder{}, lost: map[types.UID]string{}}, tokens: map[string]string{}, keeping: map[string]*sync.Mutex{}}
	if b.log == nil {
		b.log = slog.Default()
	}
	if err := b.c.namespace(ctx); apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kubernetes backend: namespace %q does not exist at %s: create it (kubectl create namespace %s; docs/kubernetes.md has its labels and the Role the server needs)", b.ns, cfg.Host, b.ns)
	} else if err != nil && !apierrors.IsForbidden(err) { // a Role of the namespace alone may not read it
		return nil, fmt.Errorf("kubernetes backend: reach the API server at %s: %w", cfg.Host, err)
	}
	maxCPUs := b.maxCPUs(ctx)
	enf := b.networkEnforcement(ctx)
	network, note := enf.network, enf.note
	b.gate = enf.gate
	b.caps = backend.Capabilities{Remote: true, Network: network, NetworkNote: note, MaxCPUs: maxCPUs,
		Limits: backend.Enforcement{Memory: true, CPU: true, Warnings: []string{
			"pids: a pod's process count is capped by the kubelet's podPidsLimit, one setting of each node, not per box",
			"disk: /workspace and /tmp are emptyDirs with the box's disk size as their limit; past it the kubelet evicts the pod (within its housekeeping period, ~10 s) rather than failing writes with ENOSPC, and the box comes back from its last kept workspace",
		}}}
	if network == backend.NetworkNone {
		b.caps.Limits.Warnings = append(b.caps.Limits.Warnings, "network: "+note)
		b.log.Warn("kubernetes backend: boxes without network cannot be made", "why", note)
	} else {
		b.log.Info("kubernetes backend", "namespace", b.ns, "server", cfg.Host, "network_policy", note, "max_cpus", maxCPUs)
	}
	return b, nil
}

// restConfig loads the client config as kubectl would.
func restConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" && context == "" && os.Getenv("KUBECONFIG") == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: load the kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config): %w", err)
	}
	return cfg, nil
}

// maxCPUs is the most allocatable CPUs of a node: no box may ask for more.
// A server whose Role cannot list nodes takes 1 and says so.
func (b *Backend) maxCPUs(ctx context.Context) int {
	nodes, err := b.c.nodes(ctx)
	if err != nil || len(nodes.Items) == 0 {
		b.log.Warn("kubernetes backend: cannot list nodes; boxes get at most 1 CPU", "err", err)
		return 1
	}
	most := 1
	for _, n := range nodes.Items {
		if q, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
			most = max(most, int(q.Value()))
		}
	}
	return most
}

// Name is "kubernetes".
func (b *Backend) Name() string { return "kubernetes" }

// Capabilities: see New.
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// ImageDigest is always "" (backend.ImageDigester): an image is a
// reference each node's kubelet pulls, and what it stands for is known
// only to the registry (or the node) at the moment of the pull, so the
// memo cache keys exec results by the image's name. Name images by digest
// (registry/x@sha256:...) or by a tag never reused to be safe from a
// rebuilt image.
func (b *Backend) ImageDigest(ctx context.Context, image string) (string, error) { return "", nil }

var _ backend.ImageDigester = (*Backend)(nil)

// Namespace is where the boxes are.
func (b *Backend) Namespace() string { return b.ns }

// objName is the name of box id's objects: the id itself where it is a
// DNS label, else a digest of it (ids may hold capitals, '_' and '.').
func objName(id string) string {
	if len(id) <= 63 && dnsLabel.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "cbx-" + hex.EncodeToString(sum[:])[:24]
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// boxSpec is what the Secret keeps of a backend.Spec: all Start needs.
type boxSpec struct {
	ID      string            `json:"id"`
	Image   string            `json:"image"`
	Env     map[string]string `json:"env,omitempty"`
	Network bool              `json:"network,omitempty"`
	Limits  backend.Limits    `json:"limits"`
	WorkDir string            `json:"workdir,omitempty"`
	Agent   string            `json:"agent_image"`
}

// Create writes the box's Secret and NetworkPolicy; no pod yet.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (backend.Info, error) {
	if err := spec.Validate(b.caps); err != nil {
		return backend.Info{}, err
	}
	agentImage, err := b.agentImage(spec.AgentBinary)
	if err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	image := spec.ImageOrDefault()
	if image == backend.DefaultImage {
		image = b.o.DefaultImage
	}
	if err := b.onNodes(ctx, image, agentImage); err != nil {
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	name := objName(spec.ID)
	labels := spec.BoxLabels()
	lj, _ := json.Marshal(labels)
	sj, _ := json.Marshal(boxSpec{ID: spec.ID, Image: spec.ImageOrDefault(), Env: spec.Env, Network: spec.Network,
		Limits: spec.Limits, WorkDir: spec.WorkDir, Agent: agentImage})
	tok := make([]byte, 32)
	rand.Read(tok)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: objLabels(name, labels),
			Annotations: map[string]string{annLabels: string(lj), annSpec: string(sj)}},
		Data: map[string][]byte{keyToken: []byte(hex.EncodeToString(tok))},
		Type: corev1.SecretTypeOpaque,
	}
	err = b.c.create(ctx, secrets, sec, sec)
	switch {
	case apierrors.IsAlreadyExists(err):
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, backend.ErrExists)
	case err != nil:
		return backend.Info{}, fmt.Errorf("create box %s: %w", spec.ID, err)
	}
	if err := b.c.create(ctx, policies, policy(name, spec.Network, sec), &netv1.NetworkPolicy{}); err != nil {
		b.Remove(context.WithoutCancel(ctx), spec.ID)
		return backend.Info{}, fmt.Errorf("create box %s: its network policy: %w", spec.ID, err)
	}
	return b.info(sec, nil), nil
}

// objLabels are the Kubernetes labels of a box's objects: the box's labels
// that are valid label values (the rest live in an annotation), and the
// object name.
func objLabels(name string, labels map[string]string) map[string]string {
	l := map[string]string{labelName: name, "app.kubernetes.io/managed-by": "cellbox"}
	for k, v := range labels {
		if len(v) <= 63 && labelValue.MatchString(v) && !strings.Contains(k, "/") {
			l[k] = v
		}
	}
	return l
}

var labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

// owned makes obj owned by the box's Secret: deleting the Secret deletes it.
func owned(sec *corev1.Secret) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Secret", Name: sec.Name, UID: sec.UID}}
}

// policy is the box's NetworkPolicy: no ingress at all (the server comes
// through port-forward, which no policy sees); egress only with network.
func policy(name string, network bool, sec *corev1.Secret) *netv1.NetworkPolicy {
	p := &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelName: name, "app.kubernetes.io/managed-by": "cellbox"}, OwnerReferences: owned(sec)},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelName: name}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress},
		},
	}
	if network {
		p.Spec.Egress = []netv1.NetworkPolicyEgressRule{{}}
	}
	return p
}

// secret reads box id's Secret; none is ErrNotFound.
func (b *Backend) secret(ctx context.Context, id string) (*corev1.Secret, error) {
	if backend.ValidID(id) != nil {
		return nil, fmt.Errorf("box %s: %w", id, backend.ErrNotFound)
	}
	sec := &corev1.Secret{}
	err := b.c.get(ctx, secrets, objName(id), sec)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("box %s: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("box %s: %w", id, err)
	}
	return sec, nil
}

// pod reads the box's pod; none is (nil, nil).
func (b *Backend) pod(ctx context.Context, name string) (*corev1.Pod, error) {
	p := &corev1.Pod{}
	err := b.c.get(ctx, pods, name, p)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Inspect says what the backend knows of box id.
func (b *Backend) Inspect(ctx context.Context, id string) (backend.Info, error) {
	sec, err := b.secret(ctx, id)
	if err != nil {
		return backend.Info{}, err
	}
	p, err := b.pod(ctx, sec.Name)
	if err != nil {
		return backend.Info{}, fmt.Errorf("inspect box %s: %w", id, err)
	}
	return b.info(sec, p), nil
}

// info is the box of sec with pod p (nil: none).
func (b *Backend) info(sec *corev1.Secret, p *corev1.Pod) backend.Info {
	var labels map[string]string
	json.Unmarshal([]byte(sec.Annotations[annLabels]), &labels)
	var spec boxSpec
	json.Unmarshal([]byte(sec.Annotations[annSpec]), &spec)
	in := backend.Info{ID: spec.ID, Labels: labels, Image: spec.Image, Created: sec.CreationTimestamp.Time, State: backend.StateCreated}
	switch {
	case p == nil && sec.Annotations[annStopped] != "":
		in.State = backend.StateStopped
		in.Lost = sec.Annotations[annLost]
	case p == nil:
	default:
		in.State, in.Exit = b.podState(p)
		if in.State != backend.StateRunning {
			in.Lost = b.lostSince(sec)
		}
	}
	return in
}

// lostSince says what a box whose pod died without a Stop loses.
func (b *Backend) lostSince(sec *corev1.Secret) string {
	if kept := sec.Annotations[annKept]; kept != "" {
		return "what changed in /workspace since it was last kept (" + kept + ", a few seconds after its last call) is lost, and /tmp"
	}
	return "its files are lost (it never slept, so nothing of it was kept)"
}

// podState is podState, and a running pod whose port-forward failed is on
// a node that does not answer.
func (b *Backend) podState(p *corev1.Pod) (backend.State, string) {
	st, why := podState(p)
	if st == backend.StateRunning && p.Status.Phase == corev1.PodRunning {
		if lost := b.unreachable(p); lost != "" {
			return backend.StateStopped, fmt.Sprintf("its node %s does not answer (%s)", p.Spec.NodeName, lost)
		}
	}
	return st, why
}

// podState maps a pod to a box state and, when it does not run, why.
func podState(p *corev1.Pod) (backend.State, string) {
	node := p.Spec.NodeName
	if p.DeletionTimestamp != nil {
		return backend.StateStopped, "its pod is being deleted"
	}
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		if p.Status.Reason == "Evicted" {
			return backend.StateStopped, fmt.Sprintf("its pod was evicted by node %s: %s (on Kubernetes a box past its disk size is evicted, not refused with ENOSPC)", node, p.Status.Message)
		}
		return backend.StateStopped, containerExit(p)
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName":
				return backend.StateStopped, fmt.Sprintf("image %s of its %s container is not on node %s and cannot be pulled (%s: %s): load it on every node (cellbox image build NAME --oci FILE, then ctr -n k8s.io images import FILE) or push it to a registry the nodes pull from; docs/kubernetes.md",
					cs.Image, cs.Name, node, w.Reason, w.Message)
			case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return backend.StateStopped, fmt.Sprintf("its %s container could not start on node %s: %s: %s", cs.Name, node, w.Reason, w.Message)
			}
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return backend.StateStopped, "no node of the cluster can take its pod: " + c.Message
		}
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse && c.Reason == "" && p.Status.Phase == corev1.PodRunning && nodeLost(p) {
			return backend.StateStopped, fmt.Sprintf("its node %s does not answer: %s", node, c.Message)
		}
	}
	return backend.StateRunning, ""
}

// nodeLost: the node lifecycle controller marked the pod not ready because
// its node stopped reporting (it taints the node and clears Ready with
// no reason of the kubelet's; a pod whose containers do run says Ready).
func nodeLost(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == boxContainer && cs.State.Running != nil && !cs.Ready {
			return true
		}
	}
	return false
}

// containerExit says how the box container ended.
func containerExit(p *corev1.Pod) string {
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if t := cs.State.Terminated; t != nil && (cs.Name == boxContainer || t.ExitCode != 0) {
			s := fmt.Sprintf("its %s container exited with code %d (%s)", cs.Name, t.ExitCode, t.Reason)
			if t.Reason == "OOMKilled" {
				s = "its agent was killed for lack of memory (OOMKilled)"
			}
			if t.Message != "" {
				s += ": " + backend.ExitSummary(t.Message)
			}
			return s
		}
	}
	return fmt.Sprintf("its pod is %s: %s %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
}

// List returns the boxes whose labels include every given label.
func (b *Backend) List(ctx context.Context, labels map[string]string) ([]backend.Info, error) {
	sel := map[string]string{"app.kubernetes.io/managed-by": "cellbox"}
	for k, v := range objLabels("", labels) {
		if k != labelName && labels[k] == v {
			sel[k] = v
		}
	}
	selector := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: sel})
	secs := &corev1.SecretList{}
	err := b.c.list(ctx, secrets, selector, secs)
	if err != nil {
		return nil, fmt.Errorf("list boxes: %w", err)
	}
	podList := &corev1.PodList{}
	if err := b.c.list(ctx, pods, selector, podList); err != nil {
		return nil, fmt.Errorf("list boxes: %w", err)
	}
	byName := map[string]*corev1.Pod{}
	for i := range podList.Items {
		byName[podList.Items[i].Name] = &podList.Items[i]
	}
	var out []backend.Info
	for i := range secs.Items {
		in := b.info(&secs.Items[i], byName[secs.Items[i].Name])
		if in.ID != "" && backend.MatchLabels(in.Labels, labels) {
			out = append(out, in)
		}
	}
	return out, nil
}

// Start makes the box's pod (a no-op while one runs) and, when a
// workspace was kept, waits for its agent and writes the workspace back.
func (b *Backend) Start(ctx context.Context, id string) (backend.Info, error) {
	sec, err := b.secret(ctx, id)
	if err != nil {
		return backend.Info{}, err
	}
	p, err := b.pod(ctx, sec.Name)
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
	}
	if p != nil {
		st, why := b.podState(p)
		if st == backend.StateRunning {
			return b.info(sec, p), nil
		}
		// Dead (evicted, failed, its node lost): replaced, away from a
		// node that does not answer.
		if strings.Contains(why, "does not answer") || strings.Contains(why, "being deleted") {
			sec = b.annotate(ctx, sec, map[string]string{annAvoid: p.Spec.NodeName})
		}
		if err := b.deletePod(ctx, p, 0); err != nil {
			return backend.Info{}, fmt.Errorf("start box %s: remove its dead pod: %w", id, err)
		}
	}
	var spec boxSpec
	if err := json.Unmarshal([]byte(sec.Annotations[annSpec]), &spec); err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: its record is damaged (%v): remove it", id, err)
	}
	pod := b.podFor(sec, spec)
	p = &corev1.Pod{}
	err = b.c.create(ctx, pods, pod, p)
	if err != nil {
		return backend.Info{}, fmt.Errorf("start box %s: create its pod: %w", id, err)
	}
	if sec.Annotations[annStopped] != "" || sec.Annotations[annKept] != "" {
		if err := b.restore(ctx, sec, p); err != nil {
			return backend.Info{}, fmt.Errorf("start box %s: %w", id, err)
		}
	}
	return b.info(sec, p), nil
}

// restore writes the kept workspace of sec's box into its new pod.
func (b *Backend) restore(ctx context.Context, sec *corev1.Secret, p *corev1.Pod) error {
	var spec boxSpec
	json.Unmarshal([]byte(sec.Annotations[annSpec]), &spec)
	r, err := b.o.Keeper.Get(ctx, spec.ID)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read its kept workspace: %w", err)
	}
	defer r.Close()
	cl := b.agentClient(spec.ID)
	defer cl.Close()
	wctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(wctx, 500*time.Millisecond)
		err := cl.WaitReady(rctx)
		rcancel()
		if err == nil {
			break
		}
		if wctx.Err() != nil {
			return fmt.Errorf("its agent did not answer within %s to take back its workspace: %w", startTimeout, err)
		}
		if cur, gerr := b.pod(wctx, p.Name); gerr == nil && cur != nil {
			if st, why := b.podState(cur); st != backend.StateRunning {
				return fmt.Errorf("its pod did not start: %s", why)
			}
		}
	}
	pr, srcErr := safe.PipeFrom("restore", func(w io.Writer) error { return underTop(r, w) })
	n, err := cl.TarIn(ctx, backend.Workspace, pr)
	b.log.Debug("kubernetes: workspace written back", "box", spec.ID, "pod", p.Name, "bytes", n, "err", err)
	pr.Close()
	if err = safe.PipeError(<-srcErr, err); err != nil {
		return fmt.Errorf("write back its kept workspace: %w", err)
	}
	return nil
}

// underTop copies the tar stream r (the agent's tar of /workspace, whose
// names start with "workspace/") to w with that first name dropped, as
// TarIn into /workspace wants it. Entries' data and PAX records (sparse
// maps) pass unchanged.
func underTop(r io.Reader, w io.Writer) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		_, rest, _ := strings.Cut(strings.TrimPrefix(hdr.Name, "./"), "/")
		if rest == "" {
			continue // the top directory itself
		}
		hdr.Name = rest
		if hdr.Typeflag == tar.TypeLink {
			_, hdr.Linkname, _ = strings.Cut(hdr.Linkname, "/")
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// startTimeout bounds the wait for a new pod's agent in Start.
const startTimeout = 3 * time.Minute

// Stop keeps the workspace (the agent's tar to the Keeper) and deletes the
// pod. A box whose agent cannot be reached loses what changed since the
// last kept copy: Info.Lost says so, and the next pod avoids the node.
func (b *Backend) Stop(ctx context.Context, id string) error {
	sec, err := b.secret(ctx, id)
	if err != nil {
		return err
	}
	p, err := b.pod(ctx, sec.Name)
	if err != nil {
		return fmt.Errorf("stop box %s: %w", id, err)
	}
	if p == nil {
		return nil
	}
	ann := map[string]string{annStopped: time.Now().UTC().Format(time.RFC3339)}
	grace := int64(2)
	if st, why := b.podState(p); st == backend.StateRunning {
		if err := b.keep(ctx, id); err != nil {
			b.log.Warn("kubernetes: stop box: its workspace could not be kept", "box", id, "err", err)
			ann[annLost] = fmt.Sprintf("%s: its agent could not hand over its workspace when it stopped (%v)", strings.TrimSuffix(b.lostSince(sec), ", and /tmp"), err)
			ann[annAvoid] = p.Spec.NodeName
			grace = 0
		} else {
			ann[annKept] = ann[annStopped]
			ann[annLost] = ""
			ann[annAvoid] = "" // the next pod may go anywhere again
		}
	} else {
		ann[annLost] = fmt.Sprintf("%s (%s)", b.lostSince(sec), why)
		grace = 0
	}
	b.annotate(ctx, sec, ann)
	if err := b.deletePod(ctx, p, grace); err != nil {
		return fmt.Errorf("stop box %s: %w", id, err)
	}
	return nil
}

// Checkpoint keeps the running box id's workspace without stopping it.
func (b *Backend) Checkpoint(ctx context.Context, id string) error {
	sec, err := b.secret(ctx, id)
	if err != nil {
		return err
	}
	if err := b.keep(ctx, id); err != nil {
		return fmt.Errorf("checkpoint box %s: %w", id, err)
	}
	b.annotate(ctx, sec, map[string]string{annKept: time.Now().UTC().Format(time.RFC3339)})
	return nil
}

var _ backend.Checkpointer = (*Backend)(nil)

// keep streams box id's /workspace from its agent to the Keeper, one
// copy of a box at a time: a checkpoint that began before a Stop ends
// before the Stop's copy starts, so the Stop's is the one kept.
func (b *Backend) keep(ctx context.Context, id string) error {
	mu := b.keepLock(id)
	mu.Lock()
	defer mu.Unlock()
	kctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	cl := b.agentClient(id)
	defer cl.Close()
	pr, srcErr := safe.PipeFrom("keep", func(w io.Writer) error {
		n, err := cl.TarOut(kctx, backend.Workspace, w)
		b.log.Debug("kubernetes: workspace kept", "box", id, "bytes", n, "err", err)
		return err
	})
	err := b.o.Keeper.Put(kctx, id, pr)
	pr.Close()
	return safe.PipeError(<-srcErr, err)
}

// keepLock is box id's lock of keep.
func (b *Backend) keepLock(id string) *sync.Mutex {
	b.keepMu.Lock()
	defer b.keepMu.Unlock()
	mu, ok := b.keeping[id]
	if !ok {
		mu = &sync.Mutex{}
		b.keeping[id] = mu
	}
	return mu
}

// keepTimeout bounds the hand-over of a workspace at Stop.
const keepTimeout = 5 * time.Minute

// annotate sets annotations of sec ("" deletes one) and returns it as
// stored; a failure is logged (the annotations are hints, the pod is not).
func (b *Backend) annotate(ctx context.Context, sec *corev1.Secret, ann map[string]string) *corev1.Secret {
	patch := map[string]any{}
	for k, v := range ann {
		if v == "" {
			patch[k] = nil
		} else {
			patch[k] = v
		}
	}
	pj, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
	got := &corev1.Secret{}
	err := b.c.mergePatch(ctx, secrets, sec.Name, pj, got)
	if err != nil {
		b.log.Warn("kubernetes: annotate box", "box", sec.Name, "err", err)
		out := sec.DeepCopy()
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		maps.Copy(out.Annotations, ann)
		return out
	}
	return got
}

// deletePod deletes p and waits until it is gone (its node freed, its
// processes ended; a pod of a node that does not answer is let go at
// once: grace 0).
func (b *Backend) deletePod(ctx context.Context, p *corev1.Pod, grace int64) error {
	b.dropForwarder(p.Name)
	uid := p.UID
	err := b.c.delete(ctx, pods, p.Name, &metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	deadline := time.Now().Add(time.Duration(grace)*time.Second + podGoneTimeout)
	for {
		cur, err := b.pod(ctx, p.Name)
		if err != nil {
			return err
		}
		if cur == nil || cur.UID != uid {
			return nil
		}
		if time.Now().After(deadline) {
			// Its kubelet does not confirm (a dead node): let it go.
			zero := int64(0)
			err := b.c.delete(ctx, pods, p.Name, &metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("delete pod %s: %w", p.Name, err)
			}
			deadline = time.Now().Add(podGoneTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// podGoneTimeout is how long deletePod waits for the kubelet to confirm a
// pod's end before it lets the pod go without.
const podGoneTimeout = 20 * time.Second

// Remove deletes the box: its pod, policy, Secret and kept workspace.
func (b *Backend) Remove(ctx context.Context, id string) error {
	if backend.ValidID(id) != nil {
		return nil
	}
	name := objName(id)
	if p, err := b.pod(ctx, name); err != nil {
		return fmt.Errorf("remove box %s: %w", id, err)
	} else if p != nil {
		if err := b.deletePod(ctx, p, 0); err != nil {
			return fmt.Errorf("remove box %s: %w", id, err)
		}
	}
	if err := b.c.delete(ctx, policies, name, &metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove box %s: its network policy: %w", id, err)
	}
	bg := metav1.DeletePropagationBackground
	if err := b.c.delete(ctx, secrets, name, &metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove box %s: %w", id, err)
	}
	b.tokMu.Lock()
	delete(b.tokens, name)
	b.tokMu.Unlock()
	b.keepMu.Lock()
	delete(b.keeping, id)
	b.keepMu.Unlock()
	return b.o.Keeper.Delete(ctx, id)
}

// agentClient is a client of box id's agent, through Dial: the backend's
// own calls (keep, restore).
func (b *Backend) agentClient(id string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
}

// Dial connects to box id's agent through the API server's port-forward.
func (b *Backend) Dial(ctx context.Context, id string) (net.Conn, error) {
	if backend.ValidID(id) != nil {
		return nil, fmt.Errorf("dial box %s: %w", id, backend.ErrNotFound)
	}
	name := objName(id)
	tok, err := b.token(ctx, id, name)
	if err != nil {
		return nil, fmt.Errorf("dial box %s: %w", id, err)
	}
	p, err := b.pod(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("dial box %s: %w: %w", id, backend.ErrNotReady, err)
	}
	if p == nil {
		return nil, fmt.Errorf("dial box %s: it has no pod (not started, or stopped): %w", id, backend.ErrNotReady)
	}
	if p.Status.Phase != corev1.PodRunning {
		st, why := b.podState(p)
		if st != backend.StateRunning {
			return nil, fmt.Errorf("dial box %s: %s: %w", id, why, backend.ErrNotReady)
		}
		return nil, fmt.Errorf("dial box %s: its pod is %s: %w", id, p.Status.Phase, backend.ErrNotReady)
	}
	return b.dialAgent(ctx, p, tok)
}

// token is box id's token, from its Secret once.
func (b *Backend) token(ctx context.Context, id, name string) (string, error) {
	b.tokMu.Lock()
	tok, ok := b.tokens[name]
	b.tokMu.Unlock()
	if ok {
		return tok, nil
	}
	sec, err := b.secret(ctx, id)
	if err != nil {
		return "", err
	}
	tok = string(sec.Data[keyToken])
	b.tokMu.Lock()
	b.tokens[name] = tok
	b.tokMu.Unlock()
	return tok, nil
}

// agentImage is the image of the agent binary at path: Options.AgentImage,
// or AgentImage(path), remembered by the file's size and time.
func (b *Backend) agentImage(path string) (string, error) {
	if b.o.AgentImage != "" {
		return b.o.AgentImage, nil
	}
	return backend.AgentImage(path)
}

// onNodes checks, when images are never pulled (PullPolicy Never), that
// some node holds each image (its status lists it): a box of an image no
// node has could never start. Where images may be pulled, or nodes cannot
// be listed, a missing image shows when the pod starts.
func (b *Backend) onNodes(ctx context.Context, images ...string) error {
	if b.o.PullPolicy != corev1.PullNever {
		return nil
	}
	nodes, err := b.c.nodes(ctx)
	if err != nil {
		return nil
	}
	have := map[string]bool{}
	for _, n := range nodes.Items {
		for _, im := range n.Status.Images {
			for _, name := range im.Names {
				have[name] = true
			}
		}
	}
	for _, im := range images {
		if !have[normalRef(im)] {
			return fmt.Errorf("image %s is on none of the cluster's %d nodes and the pull policy is Never: load it on every node (cellbox image build NAME --oci FILE, or cellbox image agent --oci FILE for the agent; then ctr -n k8s.io images import FILE): %w",
				im, len(nodes.Items), backend.ErrNoImage)
		}
	}
	return nil
}

// normalRef is image reference ref as a node lists it: with its registry
// (docker.io for a name without one) and a tag (latest) unless a digest.
func normalRef(ref string) string {
	first, _, hasSlash := strings.Cut(ref, "/")
	if !hasSlash || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		if !hasSlash {
			ref = "library/" + ref
		}
		ref = "docker.io/" + ref
	}
	last := ref[strings.LastIndexByte(ref, '/')+1:]
	if !strings.ContainsAny(last, ":@") {
		ref += ":latest"
	}
	return ref
}

// quantity is n as a Kubernetes quantity.
func quantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.BinarySI) }
