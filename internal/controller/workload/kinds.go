package workload

import (
	"context"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Kind is one workload kind the initializer keeps: where its pod template
// is and how to patch it. Jobs are not among them: the API server refuses
// any change to a Job's pod template, so a Job keeps what admission gave
// it, and the Jobs a CronJob makes get its current jobTemplate.
type Kind struct {
	// Name is the kind, as in its objects' kind field.
	Name     string
	informer cache.SharedIndexInformer
	// newObject makes an empty object of the kind: its Go type directs
	// strategic merge patches.
	newObject func() runtime.Object
	template  func(obj runtime.Object) *corev1.PodTemplateSpec
	// path leads from the object to its pod template.
	path  []string
	patch func(ctx context.Context, namespace, name string, data []byte) error
}

// patcher is what every typed client of a workload kind has.
type patcher[T any] interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

func newKind[T runtime.Object](name string, informer cache.SharedIndexInformer, client func(namespace string) patcher[T],
	template func(T) *corev1.PodTemplateSpec, path ...string) Kind {
	return Kind{
		Name:      name,
		informer:  informer,
		newObject: func() runtime.Object { return reflect.New(reflect.TypeFor[T]().Elem()).Interface().(runtime.Object) },
		template:  func(obj runtime.Object) *corev1.PodTemplateSpec { return template(obj.(T)) },
		path:      path,
		patch: func(ctx context.Context, namespace, name string, data []byte) error {
			_, err := client(namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
			return err
		},
	}
}

// Kinds are the workload kinds the initializer keeps, with their informers
// from factory.
func Kinds(kube kubernetes.Interface, factory kubeinformers.SharedInformerFactory) []Kind {
	apps, batch := factory.Apps().V1(), factory.Batch().V1()
	return []Kind{
		newKind("Deployment", apps.Deployments().Informer(),
			func(ns string) patcher[*appsv1.Deployment] { return kube.AppsV1().Deployments(ns) },
			func(o *appsv1.Deployment) *corev1.PodTemplateSpec { return &o.Spec.Template }, "spec", "template"),
		newKind("StatefulSet", apps.StatefulSets().Informer(),
			func(ns string) patcher[*appsv1.StatefulSet] { return kube.AppsV1().StatefulSets(ns) },
			func(o *appsv1.StatefulSet) *corev1.PodTemplateSpec { return &o.Spec.Template }, "spec", "template"),
		newKind("DaemonSet", apps.DaemonSets().Informer(),
			func(ns string) patcher[*appsv1.DaemonSet] { return kube.AppsV1().DaemonSets(ns) },
			func(o *appsv1.DaemonSet) *corev1.PodTemplateSpec { return &o.Spec.Template }, "spec", "template"),
		newKind("ReplicaSet", apps.ReplicaSets().Informer(),
			func(ns string) patcher[*appsv1.ReplicaSet] { return kube.AppsV1().ReplicaSets(ns) },
			func(o *appsv1.ReplicaSet) *corev1.PodTemplateSpec { return &o.Spec.Template }, "spec", "template"),
		newKind("CronJob", batch.CronJobs().Informer(),
			func(ns string) patcher[*batchv1.CronJob] { return kube.BatchV1().CronJobs(ns) },
			func(o *batchv1.CronJob) *corev1.PodTemplateSpec { return &o.Spec.JobTemplate.Spec.Template }, "spec", "jobTemplate", "spec", "template"),
	}
}
