package main

// The runtime service: pod sandboxes (records with a loopback IP) and containers (host processes,
// started through the helper in mountns.go).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type options struct {
	stateDir   string
	path       string
	images     map[string][]string
	imageDirs  []string
	ignoreUser bool
}

type sandbox struct {
	id        string
	config    *runtimeapi.PodSandboxConfig
	handler   string
	ip        string
	state     runtimeapi.PodSandboxState
	createdAt int64
}

func (s *sandbox) hostNetwork() bool {
	return s.config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
}

type runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	opts options

	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	containers map[string]*container
	ips        *ipPool
	images     map[string]*runtimeapi.Image // by normalized name
}

func newRuntime(opts options, ips *ipPool) (*runtime, error) {
	for _, d := range []string{"sandboxes", "containers"} {
		if err := os.MkdirAll(filepath.Join(opts.stateDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return &runtime{
		opts:       opts,
		sandboxes:  map[string]*sandbox{},
		containers: map[string]*container{},
		ips:        ips,
		images:     map[string]*runtimeapi.Image{},
	}, nil
}

func newID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func notFound(what, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", what, id)
}

// matches reports whether id is the wanted one: empty wants all, otherwise the ID or a prefix of it.
func matches(id, want string) bool { return want == "" || strings.HasPrefix(id, want) }

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// writeJSON writes v atomically (temp file + rename).
func writeJSON(path string, v any) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		tmp := path + ".tmp"
		if err = os.WriteFile(tmp, append(data, '\n'), 0o644); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		logf("writing %s: %v", path, err)
	}
}

// --------------------------------------------------------------------------- pod IPs

// ipPool hands out loopback addresses round-robin, skipping 127.0.0.x and .0/.255 addresses.
type ipPool struct {
	prefix netip.Prefix
	next   netip.Addr
	inUse  map[netip.Addr]bool
}

func newIPPool(cidr string) (*ipPool, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr: %w", err)
	}
	p = p.Masked()
	if !p.Addr().Is4() || !netip.MustParsePrefix("127.0.0.0/8").Contains(p.Addr()) || p.Bits() < 8 {
		return nil, fmt.Errorf("--pod-cidr %s: want a range inside 127.0.0.0/8", cidr)
	}
	return &ipPool{prefix: p, next: p.Addr(), inUse: map[netip.Addr]bool{}}, nil
}

func (p *ipPool) usable(a netip.Addr) bool {
	b := a.As4()
	return !(b[1] == 0 && b[2] == 0) && b[3] != 0 && b[3] != 255 && !p.inUse[a]
}

func (p *ipPool) allocate() (string, error) {
	size := 1 << (32 - p.prefix.Bits())
	a := p.next
	for i := 0; i < size; i++ {
		a = a.Next()
		if !p.prefix.Contains(a) {
			a = p.prefix.Addr()
		}
		if p.usable(a) {
			p.inUse[a] = true
			p.next = a
			return a.String(), nil
		}
	}
	return "", status.Errorf(codes.ResourceExhausted, "no free pod IP in %s", p.prefix)
}

func (p *ipPool) release(ip string) {
	if a, err := netip.ParseAddr(ip); err == nil {
		delete(p.inUse, a)
	}
}

// --------------------------------------------------------------------------- runtime info

func (r *runtime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version: "0.1.0", RuntimeName: "fake-cri", RuntimeVersion: "0.1.0", RuntimeApiVersion: "v1",
	}, nil
}

func (r *runtime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}}, nil
}

func (r *runtime) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}}, nil
}

func (r *runtime) UpdateRuntimeConfig(context.Context, *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

func (r *runtime) UpdateContainerResources(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

func (r *runtime) UpdatePodSandboxResources(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
}

func (r *runtime) ListContainerStats(context.Context, *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return &runtimeapi.ListContainerStatsResponse{}, nil
}

func (r *runtime) ListPodSandboxStats(context.Context, *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	return &runtimeapi.ListPodSandboxStatsResponse{}, nil
}

// --------------------------------------------------------------------------- sandboxes

func (r *runtime) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	if cfg.GetMetadata() == nil {
		return nil, status.Error(codes.InvalidArgument, "sandbox config without metadata")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := &sandbox{
		id: newID(), config: cfg, handler: req.GetRuntimeHandler(),
		state: runtimeapi.PodSandboxState_SANDBOX_READY, createdAt: time.Now().UnixNano(),
	}
	if !sb.hostNetwork() {
		ip, err := r.ips.allocate()
		if err != nil {
			return nil, err
		}
		sb.ip = ip
	}
	if dir := cfg.GetLogDirectory(); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			r.ips.release(sb.ip)
			return nil, status.Errorf(codes.Internal, "log directory: %v", err)
		}
	}
	r.sandboxes[sb.id] = sb
	r.writeSandboxRecord(sb)
	m := cfg.GetMetadata()
	logf("RunPodSandbox %s/%s (attempt %d) -> %.12s ip %q", m.GetNamespace(), m.GetName(), m.GetAttempt(), sb.id, sb.ip)
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb.id}, nil
}

func (r *runtime) writeSandboxRecord(sb *sandbox) {
	m := sb.config.GetMetadata()
	writeJSON(filepath.Join(r.opts.stateDir, "sandboxes", sb.id+".json"), map[string]any{
		"id": sb.id, "name": m.GetName(), "namespace": m.GetNamespace(), "uid": m.GetUid(),
		"attempt": m.GetAttempt(), "ip": sb.ip, "host_network": sb.hostNetwork(),
		"hostname": sb.config.GetHostname(), "log_directory": sb.config.GetLogDirectory(),
		"state": sb.state.String(), "removed": r.sandboxes[sb.id] == nil,
	})
}

// lookupSandbox finds a sandbox by ID or unique ID prefix; r.mu must be held.
func (r *runtime) lookupSandbox(id string) *sandbox {
	if sb, ok := r.sandboxes[id]; ok {
		return sb
	}
	var found *sandbox
	for sid, sb := range r.sandboxes {
		if id != "" && strings.HasPrefix(sid, id) {
			if found != nil {
				return nil
			}
			found = sb
		}
	}
	return found
}

func (r *runtime) containersOf(sandboxID string) []*container {
	var out []*container
	for _, c := range r.containers {
		if c.sandbox.id == sandboxID {
			out = append(out, c)
		}
	}
	return out
}

func (r *runtime) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	r.mu.Lock()
	sb := r.lookupSandbox(req.GetPodSandboxId())
	if sb == nil { // already removed: stopping is idempotent
		r.mu.Unlock()
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	cs := r.containersOf(sb.id)
	r.mu.Unlock()
	for _, c := range cs {
		c.stop(0)
	}
	r.mu.Lock()
	sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	r.writeSandboxRecord(sb)
	r.mu.Unlock()
	logf("StopPodSandbox %.12s", sb.id)
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *runtime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.mu.Lock()
	sb := r.lookupSandbox(req.GetPodSandboxId())
	if sb == nil {
		r.mu.Unlock()
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	cs := r.containersOf(sb.id)
	r.mu.Unlock()
	for _, c := range cs {
		r.removeContainer(c)
	}
	r.mu.Lock()
	delete(r.sandboxes, sb.id)
	r.ips.release(sb.ip)
	sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	r.writeSandboxRecord(sb)
	r.mu.Unlock()
	logf("RemovePodSandbox %.12s", sb.id)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (r *runtime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.lookupSandbox(req.GetPodSandboxId())
	if sb == nil {
		return nil, notFound("pod sandbox", req.GetPodSandboxId())
	}
	st := &runtimeapi.PodSandboxStatus{
		Id: sb.id, Metadata: sb.config.GetMetadata(), State: sb.state, CreatedAt: sb.createdAt,
		Network: &runtimeapi.PodSandboxNetworkStatus{Ip: sb.ip},
		// The kubelet recreates a sandbox whose namespace options differ from what the pod wants.
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: sb.config.GetLinux().GetSecurityContext().GetNamespaceOptions(),
		}},
		Labels: sb.config.GetLabels(), Annotations: sb.config.GetAnnotations(), RuntimeHandler: sb.handler,
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: st}
	if req.GetVerbose() {
		resp.Info = map[string]string{"pid": "0", "runtime": "fake-cri"}
	}
	return resp, nil
}

func (r *runtime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := req.GetFilter()
	r.mu.Lock()
	defer r.mu.Unlock()
	var items []*runtimeapi.PodSandbox
	for _, sb := range r.sandboxes {
		if !matches(sb.id, f.GetId()) || !labelsMatch(sb.config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != sb.state {
			continue
		}
		items = append(items, &runtimeapi.PodSandbox{
			Id: sb.id, Metadata: sb.config.GetMetadata(), State: sb.state, CreatedAt: sb.createdAt,
			Labels: sb.config.GetLabels(), Annotations: sb.config.GetAnnotations(), RuntimeHandler: sb.handler,
		})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].CreatedAt < items[j].CreatedAt })
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

// --------------------------------------------------------------------------- containers

func (r *runtime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	if cfg.GetMetadata() == nil {
		return nil, status.Error(codes.InvalidArgument, "container config without metadata")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.lookupSandbox(req.GetPodSandboxId())
	if sb == nil {
		return nil, notFound("pod sandbox", req.GetPodSandboxId())
	}
	if sb.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "pod sandbox %.12s is not ready", sb.id)
	}
	c, err := newContainer(r, sb, cfg)
	if err != nil {
		return nil, err
	}
	r.containers[c.id] = c
	c.writeRecord()
	logf("CreateContainer %s/%s/%s -> %.12s: %q", sb.config.GetMetadata().GetNamespace(),
		sb.config.GetMetadata().GetName(), cfg.GetMetadata().GetName(), c.id, c.spec.Argv)
	return &runtimeapi.CreateContainerResponse{ContainerId: c.id}, nil
}

// lookupContainer finds a container by ID or unique ID prefix; r.mu must be held.
func (r *runtime) lookupContainer(id string) *container {
	if c, ok := r.containers[id]; ok {
		return c
	}
	var found *container
	for cid, c := range r.containers {
		if id != "" && strings.HasPrefix(cid, id) {
			if found != nil {
				return nil
			}
			found = c
		}
	}
	return found
}

func (r *runtime) getContainer(id string) (*container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.lookupContainer(id); c != nil {
		return c, nil
	}
	return nil, notFound("container", id)
}

func (r *runtime) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	c, err := r.getContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if err := c.start(); err != nil {
		return nil, err
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (r *runtime) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	c, err := r.getContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	c.stop(time.Duration(req.GetTimeout()) * time.Second)
	return &runtimeapi.StopContainerResponse{}, nil
}

func (r *runtime) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	c := r.lookupContainer(req.GetContainerId())
	r.mu.Unlock()
	if c != nil { // removing is idempotent
		r.removeContainer(c)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (r *runtime) removeContainer(c *container) {
	c.stop(0)
	r.mu.Lock()
	delete(r.containers, c.id)
	c.removed = true
	c.writeRecord()
	r.mu.Unlock()
	_ = os.Remove(c.spec.Scratch)
	logf("RemoveContainer %.12s", c.id)
}

func (r *runtime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := req.GetFilter()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.Container
	for _, c := range r.containers {
		if !matches(c.id, f.GetId()) || !matches(c.sandbox.id, f.GetPodSandboxId()) ||
			!labelsMatch(c.config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != c.state {
			continue
		}
		out = append(out, &runtimeapi.Container{
			Id: c.id, PodSandboxId: c.sandbox.id, Metadata: c.config.GetMetadata(), Image: c.config.GetImage(),
			ImageRef: c.imageRef, ImageId: c.imageRef, State: c.state, CreatedAt: c.createdAt,
			Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (r *runtime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.lookupContainer(req.GetContainerId())
	if c == nil {
		return nil, notFound("container", req.GetContainerId())
	}
	st := &runtimeapi.ContainerStatus{
		Id: c.id, Metadata: c.config.GetMetadata(), State: c.state,
		CreatedAt: c.createdAt, StartedAt: c.startedAt, FinishedAt: c.finishedAt, ExitCode: c.exitCode,
		Image: c.config.GetImage(), ImageRef: c.imageRef, ImageId: c.imageRef,
		Reason: c.reason, Message: c.message,
		Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
		Mounts: c.config.GetMounts(), LogPath: c.spec.LogPath,
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: st}
	if req.GetVerbose() {
		resp.Info = map[string]string{"pid": fmt.Sprint(c.pid), "record": c.recordPath()}
	}
	return resp, nil
}

func (r *runtime) ReopenContainerLog(_ context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	c, err := r.getContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if err := c.reopenLog(); err != nil {
		return nil, err
	}
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

func (r *runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	c, err := r.getContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return c.execSync(ctx, req.GetCmd(), time.Duration(req.GetTimeout())*time.Second)
}

// killAll kills every container (the runtime is shutting down).
func (r *runtime) killAll() {
	r.mu.Lock()
	cs := make([]*container, 0, len(r.containers))
	for _, c := range r.containers {
		cs = append(cs, c)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(0) }()
	}
	wg.Wait()
}
