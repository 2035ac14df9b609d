package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// client is client-go's REST client for the two API groups a box uses
// (core/v1: pods, secrets, nodes, namespaces; networking/v1: policies),
// over a scheme of those two alone. Not the generated clientset: it pulls
// in every API group of Kubernetes, whose registration at start would
// double the cellbox binary (28 → 67 MB) and its start time, and the same
// binary is every box's agent.
type client struct {
	core, net rest.Interface
	ns        string
}

func newClient(cfg *rest.Config, ns string) (*client, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := netv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(scheme)
	mk := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion, c.APIPath = &gv, apiPath
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = "cellbox"
		}
		return rest.RESTClientFor(c)
	}
	core, err := mk(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	net, err := mk(netv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &client{core: core, net: net, ns: ns}, nil
}

// Resources, and the REST client of each.
const (
	pods     = "pods"
	secrets  = "secrets"
	policies = "networkpolicies"
)

func (c *client) rc(resource string) rest.Interface {
	if resource == policies {
		return c.net
	}
	return c.core
}

func (c *client) get(ctx context.Context, resource, name string, out runtime.Object) error {
	return c.rc(resource).Get().Namespace(c.ns).Resource(resource).Name(name).Do(ctx).Into(out)
}

func (c *client) create(ctx context.Context, resource string, obj, out runtime.Object) error {
	return c.rc(resource).Post().Namespace(c.ns).Resource(resource).Body(obj).Do(ctx).Into(out)
}

func (c *client) delete(ctx context.Context, resource, name string, opts *metav1.DeleteOptions) error {
	return c.rc(resource).Delete().Namespace(c.ns).Resource(resource).Name(name).Body(opts).Do(ctx).Error()
}

func (c *client) list(ctx context.Context, resource, selector string, out runtime.Object) error {
	return c.rc(resource).Get().Namespace(c.ns).Resource(resource).Param("labelSelector", selector).Do(ctx).Into(out)
}

func (c *client) mergePatch(ctx context.Context, resource, name string, patch []byte, out runtime.Object) error {
	return c.rc(resource).Patch(types.MergePatchType).Namespace(c.ns).Resource(resource).Name(name).Body(patch).Do(ctx).Into(out)
}

// namespace reads the backend's namespace.
func (c *client) namespace(ctx context.Context) error {
	return c.core.Get().Resource("namespaces").Name(c.ns).Do(ctx).Into(&corev1.Namespace{})
}

// nodes lists the cluster's nodes.
func (c *client) nodes(ctx context.Context) (*corev1.NodeList, error) {
	var l corev1.NodeList
	return &l, c.core.Get().Resource("nodes").Do(ctx).Into(&l)
}
