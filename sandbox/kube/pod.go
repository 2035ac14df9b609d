package kube

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// Container names of a box's pod.
const (
	boxContainer   = "box"
	agentContainer = "agent"
	agentInImage   = "/cellbox" // where the agent image holds the binary
)

// requestShare is the part of a box's CPU and memory limits its pod
// requests: the scheduler places boxes by what they request, and boxes
// mostly idle; the limits still hold each one.
const requestShare = 8

// podFor is the pod of the box of sec, with spec.
func (b *Backend) podFor(sec *corev1.Secret, spec boxSpec) *corev1.Pod {
	name := sec.Name
	lim := spec.Limits.Defaults()
	image := spec.Image
	if image == backend.DefaultImage {
		image = b.o.DefaultImage
	}
	no := false
	podSecurity, restricted := b.restricted()
	cmd := backend.Spec{WorkDir: spec.WorkDir}.AgentCommand()
	cmd = append(cmd, "--socket", "tcp:127.0.0.1:"+strconv.Itoa(agentPort), "--memory-limit", strconv.FormatInt(lim.MemoryBytes, 10))
	if !spec.Network && b.gate != "" {
		// The box's NetworkPolicy holds only once the plugin programs
		// it, some time after the pod starts: until then its agent
		// answers no one, so no command runs with a network it should
		// not have.
		cmd = append(cmd, "--egress-shut", b.gate)
	}
	env := []corev1.EnvVar{{Name: agent.EnvToken, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: keyToken}}}}
	for k, v := range backend.BoxEnv {
		if _, over := spec.Env[k]; !over {
			env = append(env, corev1.EnvVar{Name: k, Value: escape(v)})
		}
	}
	for k, v := range spec.Env {
		env = append(env, corev1.EnvVar{Name: k, Value: escape(v)})
	}
	for i := range cmd {
		cmd[i] = escape(cmd[i])
	}
	disk := quantity(lim.DiskBytes)
	agentDir := backend.AgentPath[:strings.LastIndexByte(backend.AgentPath, '/')]
	cpu := resource.NewMilliQuantity(int64(lim.CPUs*1000), resource.DecimalSI)
	reqCPU := resource.NewMilliQuantity(max(1, int64(lim.CPUs*1000)/requestShare), resource.DecimalSI)
	grace := int64(2)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: sec.Labels, OwnerReferences: owned(sec)},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Hostname:                      "box",
			NodeSelector:                  b.o.NodeSelector,
			Tolerations:                   b.o.Tolerations,
			SecurityContext:               podSecurity,
			InitContainers: []corev1.Container{{
				Name: agentContainer, Image: spec.Agent, ImagePullPolicy: b.o.PullPolicy,
				Command:         []string{agentInImage, "agent", "--install", backend.AgentPath},
				SecurityContext: restricted,
				VolumeMounts:    []corev1.VolumeMount{{Name: "agent", MountPath: agentDir}},
				// Requests of its own: an init container's limits would
				// otherwise be its requests, and a pod requests the most of
				// its init containers' and the sum of its containers'.
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceMemory: quantity(64 << 20), corev1.ResourceCPU: resource.MustParse("500m")},
					Requests: corev1.ResourceList{corev1.ResourceMemory: quantity(16 << 20), corev1.ResourceCPU: resource.MustParse("10m")}},
			}},
			Containers: []corev1.Container{{
				Name: boxContainer, Image: image, ImagePullPolicy: b.o.PullPolicy,
				Command: cmd, Env: env, WorkingDir: backend.Workspace,
				SecurityContext: restricted,
				// The agent's last words (why it would not serve) become
				// the container's termination message, which Inspect says.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "agent", MountPath: agentDir, ReadOnly: true},
					{Name: "workspace", MountPath: backend.Workspace},
					{Name: "tmp", MountPath: "/tmp"},
				},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceMemory: quantity(lim.MemoryBytes), corev1.ResourceCPU: *cpu,
						corev1.ResourceEphemeralStorage: quantity(lim.DiskBytes + agentRoom)},
					Requests: corev1.ResourceList{corev1.ResourceMemory: quantity(max(lim.MemoryBytes/requestShare, 16<<20)), corev1.ResourceCPU: *reqCPU,
						corev1.ResourceEphemeralStorage: quantity(agentRoom)},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr(quantity(agentRoom))}}},
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &disk}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &disk}}},
			},
		},
	}
	if b.o.RuntimeClass != "" {
		p.Spec.RuntimeClassName = &b.o.RuntimeClass
	}
	if avoid := sec.Annotations[annAvoid]; avoid != "" {
		// Required, not preferred: the node's death may not show in its
		// status for a while (node-monitor-grace-period), and until then
		// the scheduler may well pick it, the emptiest node now.
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpNotIn, Values: []string{avoid}}}}}}}}
	}
	return p
}

// restricted is the security context of every pod the backend makes and
// of each of its containers: the restricted Pod Security Standard in
// full, as the box user, under RuntimeDefault or cellbox's own seccomp
// filter (Options.SeccompLocalhost).
func (b *Backend) restricted() (*corev1.PodSecurityContext, *corev1.SecurityContext) {
	no, yes := false, true
	uid, gid := int64(backend.BoxUID), int64(backend.BoxGID)
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	if b.o.SeccompLocalhost != "" {
		seccomp = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &b.o.SeccompLocalhost}
	}
	return &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &gid, SeccompProfile: seccomp},
		&corev1.SecurityContext{
			RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &gid,
			AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, Privileged: &no,
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: seccomp,
		}
}

// agentRoom is the disk the agent's copy takes (the binary, ~30 MB).
const agentRoom = 64 << 20

// escape keeps the kubelet from expanding $(NAME) in a value: "$$" is
// its escape of "$".
func escape(s string) string { return strings.ReplaceAll(s, "$", "$$") }

func ptr[T any](v T) *T { return &v }
