package main

// Containers: the record, the process (started through the helper of mountns.go), its state
// machine, its log in the CRI format, and ExecSync.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// initSpec is what the container-side helper needs; it is part of the container record.
type initSpec struct {
	Scratch    string       `json:"scratch"`
	Argv       []string     `json:"argv"`
	Env        []string     `json:"env"`
	WorkingDir string       `json:"working_dir"`
	Mounts     []mountSpec  `json:"mounts"`
	Devices    []deviceSpec `json:"devices"`
	ImageDirs  []string     `json:"image_dirs,omitempty"`
	Hostname   string       `json:"hostname,omitempty"` // set: an own UTS namespace with this hostname
	UID        *int64       `json:"uid,omitempty"`
	GID        *int64       `json:"gid,omitempty"`
	Groups     []int64      `json:"groups,omitempty"`
	LogPath    string       `json:"log_path"`
}

type mountSpec struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Readonly      bool   `json:"readonly"`
}

type deviceSpec struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

type container struct {
	rt       *runtime
	id       string
	sandbox  *sandbox
	config   *runtimeapi.ContainerConfig
	spec     initSpec
	image    string // the name the pod gave
	imageRef string

	ops sync.Mutex // serializes start and stop

	// Guarded by rt.mu.
	state                            runtimeapi.ContainerState
	createdAt, startedAt, finishedAt int64
	exitCode                         int32
	reason, message                  string
	pid                              int
	proc                             *os.Process
	done                             chan struct{} // closed once the exit is recorded; nil before start
	log                              *logFile
	removed                          bool
}

func newContainer(r *runtime, sb *sandbox, cfg *runtimeapi.ContainerConfig) (*container, error) {
	id := newID()
	image := r.imageName(cfg.GetImage())
	argv := append([]string(nil), cfg.GetCommand()...)
	if len(argv) == 0 {
		argv = r.entrypoint(image)
	}
	argv = append(argv, cfg.GetArgs()...)
	if len(argv) == 0 || argv[0] == "" {
		return nil, status.Errorf(codes.InvalidArgument, "container %q has no command", cfg.GetMetadata().GetName())
	}

	sc := cfg.GetLinux().GetSecurityContext()
	var uid, gid *int64
	var groups []int64
	if !r.opts.ignoreUser {
		if v := sc.GetRunAsUser(); v != nil {
			uid = &v.Value
		}
		if v := sc.GetRunAsGroup(); v != nil {
			gid = &v.Value
		}
		groups = sc.GetSupplementalGroups()
	}

	devices := make([]deviceSpec, 0, len(cfg.GetDevices()))
	for _, d := range cfg.GetDevices() {
		devices = append(devices, deviceSpec{d.GetHostPath(), d.GetContainerPath(), d.GetPermissions()})
	}
	devicesJSON, _ := json.Marshal(devices)
	mounts := make([]mountSpec, 0, len(cfg.GetMounts()))
	for _, m := range cfg.GetMounts() {
		mounts = append(mounts, mountSpec{m.GetHostPath(), m.GetContainerPath(), m.GetReadonly()})
	}

	hostname := sb.config.GetHostname()
	if sb.hostNetwork() || hostname == "" {
		hostname, _ = os.Hostname()
	}
	home := "/root"
	if uid != nil && *uid != 0 {
		home = "/"
	}
	env := newEnv("PATH="+r.opts.path, "HOSTNAME="+hostname, "HOME="+home)
	for _, kv := range cfg.GetEnvs() {
		env.set(kv.GetKey(), string(kv.GetValue())) // a string before CRI v0.37, bytes since
	}
	if sb.ip != "" {
		env.set("FAKE_CRI_POD_IP", sb.ip)
	}
	env.set("FAKE_CRI_DEVICES", string(devicesJSON))
	env.set("FAKE_CRI_CONTAINER_ID", id)

	spec := initSpec{
		Scratch: filepath.Join(r.opts.stateDir, "containers", id, "scratch"),
		Argv:    argv, Env: env.list, WorkingDir: cfg.GetWorkingDir(),
		Mounts: mounts, Devices: devices, UID: uid, GID: gid, Groups: groups,
		ImageDirs: r.opts.imageDirs,
	}
	if !sb.hostNetwork() {
		spec.Hostname = hostname
	}
	if cfg.GetLogPath() != "" && sb.config.GetLogDirectory() != "" {
		spec.LogPath = filepath.Join(sb.config.GetLogDirectory(), cfg.GetLogPath())
	}
	if err := os.MkdirAll(spec.Scratch, 0o700); err != nil {
		return nil, status.Errorf(codes.Internal, "state directory: %v", err)
	}
	return &container{
		rt: r, id: id, sandbox: sb, config: cfg, spec: spec, image: image, imageRef: r.imageRef(image),
		state: runtimeapi.ContainerState_CONTAINER_CREATED, createdAt: time.Now().UnixNano(),
	}, nil
}

// env is an ordered environment in which a later set replaces an earlier value.
type env struct{ list []string }

func newEnv(kvs ...string) *env { return &env{list: kvs} }

func (e *env) set(key, value string) {
	for i, kv := range e.list {
		if strings.HasPrefix(kv, key+"=") {
			e.list[i] = key + "=" + value
			return
		}
	}
	e.list = append(e.list, key+"="+value)
}

func (c *container) recordPath() string {
	return filepath.Join(c.rt.opts.stateDir, "containers", c.id, "container.json")
}

func nanoTime(ns int64) string {
	if ns == 0 {
		return ""
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

// writeRecord writes containers/<id>/container.json; rt.mu must be held.
func (c *container) writeRecord() {
	pod := c.sandbox.config.GetMetadata()
	sc := c.config.GetLinux().GetSecurityContext()
	record := struct {
		ID         string            `json:"id"`
		SandboxID  string            `json:"sandbox_id"`
		Pod        map[string]string `json:"pod"`
		Name       string            `json:"name"`
		Attempt    uint32            `json:"attempt"`
		Image      string            `json:"image"`
		ImageRef   string            `json:"image_ref"`
		Command    []string          `json:"command"`
		Args       []string          `json:"args"`
		PodIP      string            `json:"pod_ip"`
		RunAsUser  *int64            `json:"run_as_user"`
		RunAsGroup *int64            `json:"run_as_group"`
		State      string            `json:"state"`
		Pid        int               `json:"pid"`
		ExitCode   int32             `json:"exit_code"`
		Reason     string            `json:"reason"`
		Message    string            `json:"message"`
		CreatedAt  string            `json:"created_at"`
		StartedAt  string            `json:"started_at"`
		FinishedAt string            `json:"finished_at"`
		Removed    bool              `json:"removed"`
		initSpec
	}{
		ID: c.id, SandboxID: c.sandbox.id,
		Pod:  map[string]string{"name": pod.GetName(), "namespace": pod.GetNamespace(), "uid": pod.GetUid()},
		Name: c.config.GetMetadata().GetName(), Attempt: c.config.GetMetadata().GetAttempt(),
		Image: c.image, ImageRef: c.imageRef,
		Command: c.config.GetCommand(), Args: c.config.GetArgs(), PodIP: c.sandbox.ip,
		State: c.state.String(), Pid: c.pid, ExitCode: c.exitCode, Reason: c.reason, Message: c.message,
		CreatedAt: nanoTime(c.createdAt), StartedAt: nanoTime(c.startedAt), FinishedAt: nanoTime(c.finishedAt),
		Removed: c.removed, initSpec: c.spec,
	}
	if v := sc.GetRunAsUser(); v != nil {
		record.RunAsUser = &v.Value
	}
	if v := sc.GetRunAsGroup(); v != nil {
		record.RunAsGroup = &v.Value
	}
	writeJSON(c.recordPath(), record)
}

// setExited records the exit; rt.mu must be held.
func (c *container) setExited(code int32, reason, message string) {
	c.state = runtimeapi.ContainerState_CONTAINER_EXITED
	c.finishedAt = time.Now().UnixNano()
	c.exitCode, c.reason, c.message = code, reason, message
	c.writeRecord()
}

func (c *container) start() error {
	c.ops.Lock()
	defer c.ops.Unlock()
	c.rt.mu.Lock()
	state := c.state
	c.rt.mu.Unlock()
	if state != runtimeapi.ContainerState_CONTAINER_CREATED {
		return status.Errorf(codes.FailedPrecondition, "container %.12s is %s, not created", c.id, state)
	}
	fail := func(err error) error {
		c.rt.mu.Lock()
		c.setExited(128, "StartError", err.Error())
		c.rt.mu.Unlock()
		logf("StartContainer %.12s failed: %v", c.id, err)
		return status.Errorf(codes.Unknown, "starting container %.12s: %v", c.id, err)
	}

	log, err := openLog(c.spec.LogPath)
	if err != nil {
		return fail(err)
	}
	var pipes [6]*os.File // stdout r/w, stderr r/w, sync r/w
	for i := 0; i < 6; i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			log.close()
			return fail(err)
		}
	}
	outR, outW, errR, errW, syncR, syncW := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5]
	cmd := exec.Command("/proc/self/exe", initArg, c.recordPath())
	cmd.Args[0] = "fake-cri-init"
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = outW, errW, []*os.File{syncW}
	flags := uintptr(syscall.CLONE_NEWNS)
	if c.spec.Hostname != "" {
		flags |= syscall.CLONE_NEWUTS
	}
	// Own process group (stop kills it all); killed if the runtime dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: flags, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	syncW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		syncR.Close()
		log.close()
		return fail(err)
	}
	// The helper reports a setup error on the sync pipe; a successful exec closes it (close-on-exec).
	msg, _ := io.ReadAll(syncR)
	syncR.Close()
	if len(msg) > 0 {
		_ = cmd.Wait()
		outR.Close()
		errR.Close()
		log.close()
		return fail(errors.New(strings.TrimSpace(string(msg))))
	}

	c.rt.mu.Lock()
	c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.startedAt = time.Now().UnixNano()
	c.pid, c.proc, c.log = cmd.Process.Pid, cmd.Process, log
	c.done = make(chan struct{})
	c.writeRecord()
	c.rt.mu.Unlock()
	logf("StartContainer %.12s: pid %d", c.id, c.pid)

	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); log.copyFrom(outR, "stdout"); outR.Close() }()
	go func() { defer copies.Done(); log.copyFrom(errR, "stderr"); errR.Close() }()
	go func() { copies.Wait(); log.close() }()
	go c.wait(cmd, &copies)
	return nil
}

func (c *container) wait(cmd *exec.Cmd, copies *sync.WaitGroup) {
	_ = cmd.Wait() // Stdout/Stderr are files: Wait does not wait for the log copies
	code := int32(-1)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Exited():
			code = int32(ws.ExitStatus())
		case ws.Signaled():
			code = 128 + int32(ws.Signal())
		}
	}
	// The main process is gone: kill what it left in its process group, as a PID namespace would.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	// Let the log copies drain, so the log is complete once the kubelet sees the exit (bounded: a
	// process that left the group may hold the pipes open).
	drained := make(chan struct{})
	go func() { copies.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(2 * time.Second):
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.rt.mu.Lock()
	c.setExited(code, reason, "")
	done := c.done
	c.rt.mu.Unlock()
	close(done)
	logf("container %.12s (pid %d) exited with %d", c.id, cmd.Process.Pid, code)
}

// stopSignals by the CRI enum's name ("SIGTERM" before CRI v0.37, "SIGNAL_SIGTERM" since).
var stopSignals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL, "SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2, "SIGWINCH": syscall.SIGWINCH,
}

// stop sends the stop signal, then SIGKILL to the process group after timeout (at once when
// timeout is 0), and returns once the exit is recorded. A container that does not run is left as is.
func (c *container) stop(timeout time.Duration) {
	c.ops.Lock()
	defer c.ops.Unlock()
	c.rt.mu.Lock()
	state, done, proc := c.state, c.done, c.proc
	c.rt.mu.Unlock()
	if state != runtimeapi.ContainerState_CONTAINER_RUNNING || done == nil {
		return
	}
	if timeout > 0 {
		sig, ok := stopSignals[strings.TrimPrefix(c.config.GetStopSignal().String(), "SIGNAL_")]
		if !ok {
			sig = syscall.SIGTERM
		}
		_ = proc.Signal(sig) // os.Process signals through a pidfd: never a reused PID
		select {
		case <-done:
			return
		case <-time.After(timeout):
		}
	}
	_ = syscall.Kill(-proc.Pid, syscall.SIGKILL)
	_ = proc.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		logf("container %.12s did not exit 30s after SIGKILL", c.id)
	}
}

func (c *container) reopenLog() error {
	c.rt.mu.Lock()
	state, log := c.state, c.log
	c.rt.mu.Unlock()
	if state != runtimeapi.ContainerState_CONTAINER_RUNNING || log == nil {
		return status.Errorf(codes.FailedPrecondition, "container %.12s is not running", c.id)
	}
	return log.reopen()
}

// execSync runs cmd with nsenter(1) in the container's mount (and UTS) namespace, root and
// working directory, with the container's env and user.
func (c *container) execSync(ctx context.Context, cmd []string, timeout time.Duration) (*runtimeapi.ExecSyncResponse, error) {
	c.rt.mu.Lock()
	state, pid := c.state, c.pid
	c.rt.mu.Unlock()
	if state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "container %.12s is not running", c.id)
	}
	if len(cmd) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty command")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, status.Errorf(codes.Unimplemented, "ExecSync needs nsenter(1): %v", err)
	}
	args := []string{"--target", strconv.Itoa(pid), "--mount", "--root", "--wd"}
	if c.spec.Hostname != "" {
		args = append(args, "--uts")
	}
	if c.spec.UID != nil {
		gid := int64(0)
		if c.spec.GID != nil {
			gid = *c.spec.GID
		}
		args = append(args, "--setuid", strconv.FormatInt(*c.spec.UID, 10), "--setgid", strconv.FormatInt(gid, 10))
	}
	args = append(append(args, "--"), cmd...)
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	x := exec.CommandContext(ctx, nsenter, args...)
	x.Env = c.spec.Env
	var stdout, stderr bytes.Buffer
	x.Stdout, x.Stderr = &stdout, &stderr
	err = x.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return nil, status.Errorf(codes.DeadlineExceeded, "command %q timed out after %v", cmd, timeout)
	}
	var exit *exec.ExitError
	code := int32(0)
	switch {
	case errors.As(err, &exit):
		code = int32(exit.ExitCode())
	case err != nil:
		return nil, status.Errorf(codes.Internal, "exec %q: %v", cmd, err)
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: code}, nil
}

// --------------------------------------------------------------------------- CRI log file

// logFile writes "<RFC3339Nano> <stream> <F|P> <text>" lines; P marks a line split at 16 KiB.
type logFile struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

func openLog(path string) (*logFile, error) {
	l := &logFile{path: path}
	if path == "" {
		return l, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return l, l.reopen()
}

func (l *logFile) reopen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path == "" {
		return nil
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("container log: %w", err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f = f
	return nil
}

func (l *logFile) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

func (l *logFile) write(stream string, partial bool, text []byte) {
	tag := " F "
	if partial {
		tag = " P "
	}
	line := time.Now().UTC().AppendFormat(make([]byte, 0, len(text)+48), time.RFC3339Nano)
	line = append(append(append(append(line, ' '), stream...), tag...), text...)
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_, _ = l.f.Write(line)
	}
}

func (l *logFile) copyFrom(r io.Reader, stream string) {
	br := bufio.NewReaderSize(r, 16*1024)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case len(line) > 0 && line[len(line)-1] == '\n':
			l.write(stream, false, line[:len(line)-1])
		case len(line) > 0 && err == bufio.ErrBufferFull:
			l.write(stream, true, line)
		case len(line) > 0: // the last line, without a newline
			l.write(stream, false, line)
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}
