package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=netop
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.spec.schedule`,description="When the command runs (UTC)."
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`,description="PENDING, RUNNING or DONE."
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.pod`,priority=1,description="The pod that runs the command."
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// At runs a shell command once, in a pod of its own, at the scheduled time
// (or at once, if that time has passed). Its phase follows the pod:
// PENDING until the pod is made, RUNNING while it runs, DONE when it ended.
// The pod is owned by the At and goes with it.
type At struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what to run, and when.
	Spec AtSpec `json:"spec"`

	// status is where the run is.
	// +optional
	Status AtStatus `json:"status,omitempty"`
}

// AtSpec is what to run, and when.
type AtSpec struct {
	// schedule is when the command runs: an RFC 3339 time such as
	// 2019-07-03T02:00:00Z, read as the instant it names (UTC). A time
	// that has passed runs at once.
	// +required
	// +kubebuilder:validation:Format=date-time
	Schedule string `json:"schedule"`

	// command is a shell command (run by sh -c) in the At's pod. Defaults
	// to printing the time it runs at.
	// +optional
	// +kubebuilder:default="date -u"
	// +kubebuilder:validation:MinLength=1
	Command string `json:"command,omitempty"`
}

// Phase is where an At's run is.
// +kubebuilder:validation:Enum=PENDING;RUNNING;DONE
type Phase string

// The phases of an At, in order.
const (
	// PhasePending: the scheduled time has not come, or the pod is not
	// made yet.
	PhasePending Phase = "PENDING"
	// PhaseRunning: the pod is made and has not ended.
	PhaseRunning Phase = "RUNNING"
	// PhaseDone: the pod ended (status.succeeded says how).
	PhaseDone Phase = "DONE"
)

// AtStatus is where an At's run is.
type AtStatus struct {
	// phase is PENDING until the pod is made, RUNNING while it runs, DONE
	// when it ended.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// pod is the name of the pod that runs the command.
	// +optional
	Pod string `json:"pod,omitempty"`

	// succeeded says, once DONE, whether the command exited 0.
	// +optional
	Succeeded *bool `json:"succeeded,omitempty"`

	// message says why the At is in its phase: the time it waits for,
	// the pod's end, or what stops it.
	// +optional
	Message string `json:"message,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// AtList is a list of Ats.
type AtList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []At `json:"items"`
}
