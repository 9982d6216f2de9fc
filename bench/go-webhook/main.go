// Command go-webhook is the reference the webhook load benchmark measures ix-gpu against: a
// mutating admission webhook written the way a careful Go author would write one with the
// standard library alone. It decodes the review into typed structs holding only the fields the
// decision reads, and injects what ix-gpu's built-in "iluvatar" profile injects (the driver
// volume, its mount, LD_LIBRARY_PATH prepended, the GPU toleration, the injected annotation), and
// what ix-gpu adds for the ix-gpu.io/gpu-type annotation: a required node affinity on the models
// it names, so that a burst's scheduler has the same pods to place behind either webhook.
//
// It is a yardstick, not a product: no config, no namespace facts, no bounds beyond the body
// size, no record of injected items. Whatever ix-gpu does beyond this is what it costs. Its one
// metric, the reviews it answered (/metrics), lets a burst see how the apiserver shared them
// among the replicas, as ix-gpu's own histogram does.
//
//	go-webhook -cert tls.crt -key tls.key -addr 127.0.0.1:9443 -digest 91a2b21207
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

const (
	resource   = "iluvatar.com/gpu"
	volumeName = "ix-gpu-iluvatar-driver"
	driverPath = "/usr/local/corex"
	envName    = "LD_LIBRARY_PATH"
	envValue   = "/usr/local/corex/lib64"
	injectedAt = "ix-gpu.io/injected"
	gpuType    = "ix-gpu.io/gpu-type"
	productKey = "ix-gpu.io/gpu.product"
	maxBody    = 3 << 20
	// reviewsMetric is the counter /metrics serves.
	reviewsMetric = "ix_gpu_go_reference_reviews_total"
)

type review struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Request    *request `json:"request"`
}

type request struct {
	UID       string `json:"uid"`
	Operation string `json:"operation"`
	Object    *pod   `json:"object"`
}

type pod struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Volumes        []named      `json:"volumes"`
		Containers     []container  `json:"containers"`
		InitContainers []container  `json:"initContainers"`
		Tolerations    []toleration `json:"tolerations"`
		Affinity       *affinity    `json:"affinity"`
	} `json:"spec"`
}

// affinity holds the levels down to the required node selector terms; a nil pointer is a level
// the pod does not have, where the whole rest is added in one op.
type affinity struct {
	NodeAffinity *struct {
		Required *struct {
			Terms []struct {
				MatchExpressions []expression `json:"matchExpressions"`
			} `json:"nodeSelectorTerms"`
		} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
	} `json:"nodeAffinity"`
}

type expression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values"`
}

type named struct {
	Name string `json:"name"`
}

type envVar struct {
	Name      string          `json:"name"`
	Value     *string         `json:"value"`
	ValueFrom json.RawMessage `json:"valueFrom"`
}

type mount struct {
	MountPath string `json:"mountPath"`
}

type container struct {
	Env          []envVar `json:"env"`
	VolumeMounts []mount  `json:"volumeMounts"`
	Resources    struct {
		Limits map[string]json.RawMessage `json:"limits"`
	} `json:"resources"`
}

type toleration struct {
	Key      string `json:"key"`
	Operator string `json:"operator"`
	Effect   string `json:"effect"`
}

type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     []byte `json:"patch,omitempty"` // encoding/json writes []byte as base64
}

var (
	theVolume     = map[string]any{"name": volumeName, "hostPath": map[string]any{"path": driverPath, "type": "Directory"}}
	theMount      = map[string]any{"name": volumeName, "mountPath": driverPath, "readOnly": true}
	theToleration = map[string]any{"key": resource, "operator": "Exists", "effect": "NoSchedule"}
)

// gpus reads a limit the way the apiserver serialises one: a JSON string ("1") or a number.
func gpus(raw json.RawMessage) int {
	text := strings.Trim(string(raw), `"`)
	n, err := strconv.Atoi(text)
	if err != nil {
		return 0
	}
	return n
}

func prependPath(current string) string {
	for _, part := range strings.Split(current, ":") {
		if part == envValue {
			return current
		}
	}
	if current == "" {
		return envValue
	}
	return envValue + ":" + current
}

func addToList(ops []op, path string, exists bool, item any) []op {
	if exists {
		return append(ops, op{"add", path + "/-", item})
	}
	return append(ops, op{"add", path, []any{item}})
}

func mutateContainers(ops []op, list string, containers []container) ([]op, bool) {
	any := false
	for i, c := range containers {
		if gpus(c.Resources.Limits[resource]) <= 0 {
			continue
		}
		any = true
		ptr := "/spec/" + list + "/" + strconv.Itoa(i)
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == driverPath {
				mounted = true
			}
		}
		if !mounted {
			ops = addToList(ops, ptr+"/volumeMounts", c.VolumeMounts != nil, theMount)
		}
		at := -1
		for j, e := range c.Env {
			if e.Name == envName {
				at = j
			}
		}
		switch {
		case at < 0:
			ops = addToList(ops, ptr+"/env", c.Env != nil, map[string]string{"name": envName, "value": envValue})
		case c.Env[at].ValueFrom == nil:
			current := ""
			if c.Env[at].Value != nil {
				current = *c.Env[at].Value
			}
			if merged := prependPath(current); merged != current {
				kind := "replace"
				if c.Env[at].Value == nil {
					kind = "add"
				}
				ops = append(ops, op{kind, ptr + "/env/" + strconv.Itoa(at) + "/value", merged})
			}
		}
	}
	return ops, any
}

// models reads the gpu-type annotation as ix-gpu does for the spellings the benches use: a
// comma-separated list, an "Iluvatar" prefix dropped, blanks and repeats dropped. (ix-gpu also
// drops other vendors' names, turns a model into a valid label value and bounds the list.)
func models(annotation string) []string {
	var out []string
	seen := map[string]bool{}
	for _, part := range strings.Split(annotation, ",") {
		model := strings.TrimSpace(part)
		if len(model) > 9 && strings.EqualFold(model[:8], "iluvatar") && strings.ContainsRune(" -_", rune(model[8])) {
			model = strings.TrimSpace(model[9:])
		}
		if model != "" && !seen[model] {
			seen[model] = true
			out = append(out, model)
		}
	}
	return out
}

// requireModels ANDs "product In models" into every required node selector term, or adds the
// first missing level whole, holding one term.
func requireModels(ops []op, a *affinity, values []string) []op {
	wanted := expression{productKey, "In", values}
	terms := []any{map[string]any{"matchExpressions": []expression{wanted}}}
	switch {
	case a == nil:
		return append(ops, op{"add", "/spec/affinity", map[string]any{"nodeAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": terms}}}})
	case a.NodeAffinity == nil:
		return append(ops, op{"add", "/spec/affinity/nodeAffinity", map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": terms}}})
	case a.NodeAffinity.Required == nil:
		return append(ops, op{"add", "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
			map[string]any{"nodeSelectorTerms": terms}})
	case len(a.NodeAffinity.Required.Terms) == 0:
		return append(ops, op{"add", "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms", terms})
	}
	for i, term := range a.NodeAffinity.Required.Terms {
		present := false
		for _, e := range term.MatchExpressions {
			present = present || (e.Key == wanted.Key && e.Operator == wanted.Operator &&
				strings.Join(e.Values, ",") == strings.Join(values, ","))
		}
		if !present {
			path := "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/" +
				strconv.Itoa(i) + "/matchExpressions"
			ops = addToList(ops, path, term.MatchExpressions != nil, wanted)
		}
	}
	return ops
}

func mutate(p *pod, digest string) []op {
	var ops []op
	var gpu, gpuInit bool
	ops, gpuInit = mutateContainers(ops, "initContainers", p.Spec.InitContainers)
	ops, gpu = mutateContainers(ops, "containers", p.Spec.Containers)
	if !gpu && !gpuInit {
		return nil
	}
	head := []op{}
	hasVolume := false
	for _, v := range p.Spec.Volumes {
		if v.Name == volumeName {
			hasVolume = true
		}
	}
	if !hasVolume {
		head = addToList(head, "/spec/volumes", p.Spec.Volumes != nil, theVolume)
	}
	ops = append(head, ops...)
	tolerated := false
	for _, t := range p.Spec.Tolerations {
		if t.Key == resource && t.Operator == "Exists" && t.Effect == "NoSchedule" {
			tolerated = true
		}
	}
	if !tolerated {
		ops = addToList(ops, "/spec/tolerations", p.Spec.Tolerations != nil, theToleration)
	}
	if values := models(p.Metadata.Annotations[gpuType]); len(values) > 0 {
		ops = requireModels(ops, p.Spec.Affinity, values)
	}
	value := "iluvatar@" + digest
	if p.Metadata.Annotations[injectedAt] != value {
		if p.Metadata.Annotations == nil {
			ops = append(ops, op{"add", "/metadata/annotations", map[string]string{injectedAt: value}})
		} else {
			ops = append(ops, op{"add", "/metadata/annotations/ix-gpu.io~1injected", value})
		}
	}
	return ops
}

// reviews counts the POSTs to /mutate, answered or refused.
var reviews atomic.Int64

func handle(digest string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		reviews.Add(1)
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		var in review
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		out := response{UID: in.Request.UID, Allowed: true}
		if in.Request.Operation == "CREATE" && in.Request.Object != nil && in.Request.Object.Kind == "Pod" {
			if ops := mutate(in.Request.Object, digest); len(ops) > 0 {
				patch, err := json.Marshal(ops)
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				out.PatchType, out.Patch = "JSONPatch", patch
			}
		}
		answer, err := json.Marshal(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": out,
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}
}

func main() {
	cert := flag.String("cert", "tls.crt", "serving certificate (PEM)")
	key := flag.String("key", "tls.key", "its key (PEM)")
	addr := flag.String("addr", "127.0.0.1:9443", "listen address")
	digest := flag.String("digest", "0000000000", "config digest written into the injected annotation")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", handle(*digest))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ok"}`)) })
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, "# HELP "+reviewsMetric+" Reviews POSTed to /mutate.\n# TYPE "+reviewsMetric+
			" counter\n"+reviewsMetric+" "+strconv.FormatInt(reviews.Load(), 10)+"\n")
	})
	server := &http.Server{Addr: *addr, Handler: mux}
	log.Fatal(server.ListenAndServeTLS(*cert, *key))
}
