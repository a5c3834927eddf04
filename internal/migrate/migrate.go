// Package migrate rewrites the stored objects of a CustomResourceDefinition
// in its storage version and then records that no other version is stored,
// as kube-storage-version-migrator does: after a CRD's storage version
// changes, etcd still holds every object in the version it was last written
// in, and status.storedVersions lists each version that may still be
// there. A version can leave the CRD only once it is in no object and so
// not in storedVersions.
//
// An update that changes nothing is written to etcd only when its encoding
// differs from what is stored, which is exactly when the object is stored
// in another version: so each object is read and written back unchanged.
// An object changed meanwhile (a conflict) was written by that change, in
// the storage version, and one deleted meanwhile needs nothing. Objects
// made after the pass starts are written in the storage version.
package migrate

import (
	"context"
	"fmt"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
)

// pageSize is how many objects one list returns: the API server's own
// default for kubectl's chunked lists.
const pageSize = 500

// Result is what a migration did.
type Result struct {
	// StorageVersion is the version every object is now stored in.
	StorageVersion string
	// Rewritten counts the objects written back; Changed those changed or
	// deleted by someone else meanwhile, which needed no write.
	Rewritten, Changed int
	// StoredVersions is status.storedVersions before the migration.
	StoredVersions []string
}

// Storage migrates every object of the CRD named crd to its storage
// version and sets its status.storedVersions to that version alone. It is
// safe to run again, and at any time: a run that stops part way leaves
// storedVersions as it was.
func Storage(ctx context.Context, crds apiextensionsclient.Interface, dyn dynamic.Interface, crd string) (Result, error) {
	def, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd, metav1.GetOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("CRD %s: %w", crd, err)
	}
	storage := storageVersion(def)
	if storage == "" {
		return Result{}, fmt.Errorf("CRD %s has no storage version", crd)
	}
	res := Result{StorageVersion: storage, StoredVersions: slices.Clone(def.Status.StoredVersions)}
	logger := klog.FromContext(ctx).WithValues("crd", crd, "storageVersion", storage)
	resource := dyn.Resource(schema.GroupVersionResource{Group: def.Spec.Group, Version: storage, Resource: def.Spec.Names.Plural})
	opts := metav1.ListOptions{Limit: pageSize}
	for {
		page, err := resource.List(ctx, opts)
		if err != nil {
			return res, fmt.Errorf("listing %s: %w", crd, err)
		}
		for i := range page.Items {
			obj := &page.Items[i]
			var rewrite dynamic.ResourceInterface = resource
			if def.Spec.Scope == apiextensionsv1.NamespaceScoped {
				rewrite = resource.Namespace(obj.GetNamespace())
			}
			_, err := rewrite.Update(ctx, obj, metav1.UpdateOptions{FieldManager: FieldManager})
			switch {
			case err == nil:
				res.Rewritten++
			case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
				res.Changed++
			default:
				return res, fmt.Errorf("rewriting %s %s/%s: %w", crd, obj.GetNamespace(), obj.GetName(), err)
			}
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			break
		}
	}
	logger.V(1).Info("Rewrote stored objects", "rewritten", res.Rewritten, "changed", res.Changed)
	if err := setStoredVersions(ctx, crds, crd, storage); err != nil {
		return res, err
	}
	logger.Info("Storage migrated", "rewritten", res.Rewritten, "storedVersionsBefore", res.StoredVersions)
	return res, nil
}

// FieldManager is the field manager of the rewrites.
const FieldManager = "netop-storage-migration"

// storageVersion is the name of the version the CRD stores objects in.
func storageVersion(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

// setStoredVersions records that storage is the only stored version. The
// CRD read again must still store in it: had the storage version changed
// during the pass, objects written since might be in the new one, and the
// migration must run again.
func setStoredVersions(ctx context.Context, crds apiextensionsclient.Interface, crd, storage string) error {
	client := crds.ApiextensionsV1().CustomResourceDefinitions()
	def, err := client.Get(ctx, crd, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("CRD %s: %w", crd, err)
	}
	if now := storageVersion(def); now != storage {
		return fmt.Errorf("CRD %s: the storage version changed from %s to %s during the migration; run it again", crd, storage, now)
	}
	if slices.Equal(def.Status.StoredVersions, []string{storage}) {
		return nil
	}
	def.Status.StoredVersions = []string{storage}
	// An update, not a patch: its resourceVersion makes it fail if the CRD
	// changed since it was read.
	if _, err := client.UpdateStatus(ctx, def, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("setting status.storedVersions of CRD %s to [%s]: %w", crd, storage, err)
	}
	return nil
}
