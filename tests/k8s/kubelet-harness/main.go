// Command kubelet-harness runs the kubelet's real device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) without the rest of the kubelet, so that tests
// can drive a device plugin through the same registration, ListAndWatch, Allocate and checkpoint
// code a node runs.
//
// Protocol: one JSON object per line on stdin, one JSON object per line on stdout. Every reply has
// "ok" (and "error" when ok is false). The first line written is {"ok":true,"event":"ready",...}
// once the registration socket (kubelet.sock) is being served.
//
//	{"cmd":"capacity"}
//	    -> capacity, allocatable (resource -> count), deleted (resources dropped after the grace
//	       period), healthy_devices (resource -> device ID -> {numa})
//	{"cmd":"allocate","pod":"<uid>/<name>","container":"c","resource":"vendor.com/gpu","count":2}
//	{"cmd":"allocate","pod":"<uid>","container":"c","resources":{"vendor.com/gpu":2}}
//	    -> Allocate then GetDeviceRunContainerOptions: envs, devices, mounts, annotations,
//	       cdi_devices, device_ids (resource -> sorted IDs)
//	{"cmd":"remove","pod":"<uid>"}   the pod is no longer active; its devices are freed on the
//	                                 next allocation (as the kubelet does)
//	{"cmd":"restart"}   a kubelet restart: stop the manager and start a new one, which deletes every
//	                    socket in the directory and reads the checkpoint; known containers are
//	                    reported as still running
//	{"cmd":"quit"}
//
// The device manager always serves /var/lib/kubelet/device-plugins/kubelet.sock (the path is fixed
// in NewManagerImpl). With --dir, the harness re-executes itself in a private mount namespace in
// which --dir is bind-mounted over that path: the device manager sees its usual directory, the
// plugin under test and the test see --dir, and nothing on the host's
// /var/lib/kubelet/device-plugins is touched (the empty directory is created if missing, as a
// mount point).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const nsEnv = "IX_KUBELET_HARNESS_IN_NAMESPACE"

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

type harness struct {
	logger   klog.Logger
	topology []cadvisorapi.Node
	mgr      *devicemanager.ManagerImpl
	mu       sync.Mutex // guards pods and order (activePods is called from the manager)
	pods     map[types.UID]*v1.Pod
	order    []types.UID
	dir      string
}

// socket is kubelet.sock as the plugin under test sees it (in --dir).
func (h *harness) socket() string {
	return filepath.Join(h.dir, filepath.Base(pluginapi.KubeletSocket))
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*v1.Pod, 0, len(h.order))
	for _, uid := range h.order {
		out = append(out, h.pods[uid])
	}
	return out
}

func (h *harness) start(initial containermap.ContainerMap, running sets.Set[string]) error {
	mgr, err := devicemanager.NewManagerImpl(h.logger, h.topology, topologymanager.NewFakeManager(h.logger))
	if err != nil {
		return fmt.Errorf("NewManagerImpl: %w", err)
	}
	if err := mgr.Start(h.logger, h.activePods, sourcesReady{}, initial, running); err != nil {
		return fmt.Errorf("device manager Start: %w", err)
	}
	h.mgr = mgr
	return nil
}

func (h *harness) restart() error {
	if h.mgr != nil {
		if err := h.mgr.Stop(h.logger); err != nil {
			return fmt.Errorf("device manager Stop: %w", err)
		}
		h.mgr = nil
	}
	// The runtime still runs every container the harness allocated for.
	initial := containermap.NewContainerMap()
	running := sets.New[string]()
	for _, uid := range h.order {
		for _, c := range h.pods[uid].Spec.Containers {
			id := string(uid) + "/" + c.Name
			initial.Add(string(uid), c.Name, id)
			running.Insert(id)
		}
	}
	return h.start(initial, running)
}

type command struct {
	Cmd       string           `json:"cmd"`
	Pod       string           `json:"pod"`
	Namespace string           `json:"namespace"`
	Container string           `json:"container"`
	Resource  string           `json:"resource"`
	Count     int64            `json:"count"`
	Resources map[string]int64 `json:"resources"`
}

type reply map[string]any

func quantities(list v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for name, q := range list {
		out[string(name)] = q.Value()
	}
	return out
}

func (h *harness) capacity() reply {
	capacity, allocatable, deleted := h.mgr.GetCapacity(h.logger)
	sort.Strings(deleted)
	devices := map[string]map[string]any{}
	// GetAllocatableDevices lists healthy devices only.
	for res, instances := range h.mgr.GetAllocatableDevices(h.logger) {
		devices[res] = map[string]any{}
		for id, dev := range instances {
			numa := []int64{}
			if dev.Topology != nil {
				for _, n := range dev.Topology.Nodes {
					numa = append(numa, n.ID)
				}
			}
			devices[res][id] = map[string]any{"numa": numa}
		}
	}
	return reply{
		"capacity":        quantities(capacity),
		"allocatable":     quantities(allocatable),
		"deleted":         deleted,
		"healthy_devices": devices,
	}
}

func (h *harness) allocate(c command) (reply, error) {
	if c.Pod == "" || c.Container == "" {
		return nil, errors.New("allocate needs pod and container")
	}
	want := map[string]int64{}
	for k, v := range c.Resources {
		want[k] = v
	}
	if c.Resource != "" {
		want[c.Resource] = c.Count
	}
	if len(want) == 0 {
		return nil, errors.New("allocate needs resource+count or resources")
	}
	uid, name, _ := strings.Cut(c.Pod, "/")
	if name == "" {
		name = uid
	}
	ns := c.Namespace
	if ns == "" {
		ns = "default"
	}
	limits := v1.ResourceList{}
	for res, n := range want {
		limits[v1.ResourceName(res)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	h.mu.Lock()
	pod, ok := h.pods[types.UID(uid)]
	if !ok {
		pod = &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: name, Namespace: ns}}
		h.pods[types.UID(uid)] = pod
		h.order = append(h.order, types.UID(uid))
	}
	var container *v1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == c.Container {
			container = &pod.Spec.Containers[i]
		}
	}
	if container == nil {
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: c.Container})
		container = &pod.Spec.Containers[len(pod.Spec.Containers)-1]
	}
	container.Resources = v1.ResourceRequirements{Limits: limits, Requests: limits.DeepCopy()}
	h.mu.Unlock()

	if err := h.mgr.Allocate(context.Background(), pod, container, lifecycle.AddOperation); err != nil {
		return nil, fmt.Errorf("Allocate: %w", err)
	}
	opts, err := h.mgr.GetDeviceRunContainerOptions(context.Background(), pod, container)
	if err != nil {
		return nil, fmt.Errorf("GetDeviceRunContainerOptions: %w", err)
	}
	envs := []map[string]string{}
	devices := []map[string]string{}
	mounts := []map[string]any{}
	annotations := []map[string]string{}
	cdi := []string{}
	if opts != nil {
		for _, e := range opts.Envs {
			envs = append(envs, map[string]string{"name": e.Name, "value": e.Value})
		}
		for _, d := range opts.Devices {
			devices = append(devices, map[string]string{
				"host_path": d.PathOnHost, "container_path": d.PathInContainer, "permissions": d.Permissions,
			})
		}
		for _, m := range opts.Mounts {
			mounts = append(mounts, map[string]any{
				"name": m.Name, "host_path": m.HostPath, "container_path": m.ContainerPath, "read_only": m.ReadOnly,
			})
		}
		for _, a := range opts.Annotations {
			annotations = append(annotations, map[string]string{"name": a.Name, "value": a.Value})
		}
		for _, d := range opts.CDIDevices {
			cdi = append(cdi, d.Name)
		}
	}
	ids := map[string][]string{}
	for res, instances := range h.mgr.GetDevices(uid, c.Container) {
		list := make([]string, 0, len(instances))
		for id := range instances {
			list = append(list, id)
		}
		sort.Strings(list)
		ids[res] = list
	}
	return reply{
		"envs": envs, "devices": devices, "mounts": mounts, "annotations": annotations,
		"cdi_devices": cdi, "device_ids": ids,
	}, nil
}

func (h *harness) handle(c command) (reply, bool, error) {
	switch c.Cmd {
	case "capacity":
		return h.capacity(), false, nil
	case "allocate":
		r, err := h.allocate(c)
		return r, false, err
	case "remove":
		uid, _, _ := strings.Cut(c.Pod, "/")
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.pods[types.UID(uid)]; !ok {
			return nil, false, fmt.Errorf("unknown pod %q", uid)
		}
		delete(h.pods, types.UID(uid))
		for i, u := range h.order {
			if u == types.UID(uid) {
				h.order = append(h.order[:i], h.order[i+1:]...)
				break
			}
		}
		return reply{}, false, nil
	case "restart":
		if err := h.restart(); err != nil {
			return nil, false, err
		}
		return reply{"socket": h.socket(), "dir": h.dir}, false, nil
	case "quit":
		if h.mgr != nil {
			_ = h.mgr.Stop(h.logger)
		}
		return reply{}, true, nil
	default:
		return nil, false, fmt.Errorf("unknown cmd %q", c.Cmd)
	}
}

// reexecInNamespace runs this program again in a private mount namespace (see the package comment)
// and returns its exit code.
func reexecInNamespace(dir string) int {
	if err := os.MkdirAll(pluginapi.DevicePluginPath, 0o750); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-harness: cannot create the mount point %s: %v\n", pluginapi.DevicePluginPath, err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-harness: %v\n", err)
		return 1
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), nsEnv+"="+dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Go makes the new namespace's mounts private (MS_REC|MS_PRIVATE on /) before exec.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-harness: cannot start in a private mount namespace (needs root): %v\n", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if code := exit.ExitCode(); code >= 0 {
				return code
			}
			return 128 + int(exit.Sys().(syscall.WaitStatus).Signal())
		}
		return 1
	}
	return 0
}

func main() {
	fs := flag.NewFlagSet("kubelet-harness", flag.ExitOnError)
	dir := fs.String("dir", "", "device-plugin directory to use instead of "+pluginapi.DevicePluginPath+
		" (bind-mounted over it in a private mount namespace; needs root)")
	numa := fs.Int("numa-nodes", 0, "NUMA nodes the device manager is told the machine has")
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "true")
	_ = fs.Parse(os.Args[1:])

	fixed := filepath.Clean(pluginapi.DevicePluginPath)
	if *dir != "" {
		abs, err := filepath.Abs(*dir)
		if err != nil {
			klog.Fatalf("--dir: %v", err)
		}
		*dir = abs
		if abs != fixed {
			inside := os.Getenv(nsEnv)
			if inside == "" {
				os.Exit(reexecInNamespace(abs))
			}
			if inside != abs {
				klog.Fatalf("%s=%q does not match --dir %q", nsEnv, inside, abs)
			}
			if err := os.MkdirAll(abs, 0o750); err != nil {
				klog.Fatalf("--dir: %v", err)
			}
			if err := syscall.Mount(abs, fixed, "", syscall.MS_BIND, ""); err != nil {
				klog.Fatalf("bind-mounting %s over %s: %v", abs, fixed, err)
			}
		}
	} else {
		*dir = fixed
	}

	h := &harness{logger: klog.Background(), pods: map[types.UID]*v1.Pod{}, dir: *dir}
	for i := 0; i < *numa; i++ {
		h.topology = append(h.topology, cadvisorapi.Node{Id: i})
	}

	out := json.NewEncoder(os.Stdout)
	emit := func(r reply, err error) {
		if r == nil {
			r = reply{}
		}
		if err != nil {
			r["ok"] = false
			r["error"] = err.Error()
		} else {
			r["ok"] = true
		}
		if e := out.Encode(r); e != nil {
			klog.Fatalf("writing stdout: %v", e)
		}
	}

	if err := h.start(containermap.NewContainerMap(), sets.New[string]()); err != nil {
		emit(reply{"event": "ready"}, err)
		os.Exit(1)
	}
	emit(reply{"event": "ready", "socket": h.socket(), "dir": h.dir, "pid": os.Getpid()}, nil)

	go func() {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		if h.mgr != nil {
			_ = h.mgr.Stop(h.logger)
		}
		os.Exit(0)
	}()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			emit(nil, fmt.Errorf("bad command %q: %w", line, err))
			continue
		}
		r, quit, err := h.handle(c)
		emit(r, err)
		if quit {
			return
		}
	}
	// stdin closed: behave like quit.
	if h.mgr != nil {
		_ = h.mgr.Stop(h.logger)
	}
}
