// Command fake-cri is a small container runtime (CRI v1, runtime and image services on a unix
// socket) that really runs pods for a real kubelet, without images or a container engine:
//
//	fake-cri --endpoint unix:///path/to/cri.sock [--state-dir DIR] [--pod-cidr 127.0.1.0/24]
//	         [--path PATH] [--image NAME=COMMAND ...] [--image-dir DIR ...] [--ignore-run-as-user]
//
// The model:
//
//   - A pod sandbox is a record, not a process. Unless the pod uses the host network it gets its own
//     loopback address from --pod-cidr (default 127.0.0.0/16, never 127.0.0.x, never .0 or .255),
//     reported as the pod IP by PodSandboxStatus. All of 127/8 routes to lo, so the pod's processes
//     can bind that address, and the kubelet's httpGet/tcpSocket probes reach them there.
//   - A container is a host process (same PID and network namespaces as the runtime) in a private
//     mount namespace, and in its own UTS namespace with the pod's hostname unless the pod uses the
//     host network. Its root is the host's root (bound recursively onto a tmpfs in the state dir,
//     visible only inside that namespace, then chroot). Every CRI mount (ConfigMap, Secret,
//     projected token, hostPath, emptyDir, /etc/hosts, /dev/termination-log, as the kubelet wrote
//     them) is bind-mounted at its container path, read-only when asked. A missing mount point is
//     created without touching the host: its nearest existing parent directory is first replaced,
//     inside the namespace only, by a tmpfs copy whose entries are bind mounts of the originals
//     (see mountns.go). Mount propagation and SELinux relabelling are ignored.
//   - Devices (what a device plugin's Allocate returned) are bind-mounted from the host when the
//     host path exists, and otherwise appear as empty placeholder files at their container paths.
//     They are also recorded: the process gets FAKE_CRI_DEVICES, a JSON list of
//     {"host_path","container_path","permissions"}, and the container record in the state dir
//     has them (see below).
//   - Images: PullImage remembers any image name, ImageStatus/ListImages report the remembered
//     ones. An image is only a name: the container runs its command and args (CRI command and
//     args, i.e. the pod's command and args) on the host, resolved on the container's PATH. When
//     the pod gives no command, the image's entrypoint is the --image mapping for that image, or
//     else the last path component of the image's repository (so "registry.example/ix-gpu:1.0"
//     runs the host's "ix-gpu" found on PATH). Images run as root unless the pod sets runAsUser.
//     The host's files are every image's files, so a pod volume over an ancestor of the
//     installation the containers run (an emptyDir at /tmp when that installation is a checkout
//     under /tmp) would hide it; each --image-dir is therefore bound again at its own path after
//     such a volume, as an image's files stay visible beside its volumes in a real runtime.
//   - Env: PATH (--path, default this process's PATH), HOSTNAME, HOME, then the CRI request's env
//     (the pod's env plus what a device plugin's Allocate returned), then FAKE_CRI_POD_IP (the
//     sandbox's address; absent for host-network pods), FAKE_CRI_DEVICES and
//     FAKE_CRI_CONTAINER_ID.
//   - Logs: stdout and stderr go to the log path the kubelet asked for (sandbox log directory +
//     container log path) in the CRI log format "<RFC3339Nano> stdout|stderr F|P <line>", so
//     `kubectl logs` works. ReopenContainerLog is supported.
//   - State: Created -> Running -> Exited (exit code; 128+N for signal N), with created, started
//     and finished times. StopContainer sends the stop signal (SIGTERM unless the pod says
//     otherwise) to the main process and SIGKILL to its process group after the timeout; once the
//     main process has exited its whole process group is killed, as a PID namespace would be.
//     Processes that leave the process group (setsid) are not tracked.
//   - State directory (--state-dir, default <socket dir>/fake-cri-state): sandboxes/<id>.json and
//     containers/<id>/container.json (pod, image, argv, env, mounts, devices, pod IP, log path,
//     pid, state, exit code), rewritten on every state change and kept after removal (marked
//     "removed") so tests can read them. containers/<id>/scratch is the empty host directory
//     the container's tmpfs is mounted on; it is deleted by RemoveContainer.
//   - ExecSync runs the command through nsenter(1) in the container's mount namespace and root.
//     Exec, Attach, PortForward and checkpoints are not supported. Stats are empty.
//   - Nothing survives the runtime: on SIGTERM/SIGINT all containers are killed, and containers
//     are also killed (parent-death signal) if the runtime dies.
//
// Run it as root. It prints "ready <endpoint>" on stdout once the socket is served.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// initArg as the first argument makes the binary the container-side helper (see mountns.go).
const initArg = "__fake-cri-container-init"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

type imageFlag map[string][]string

// listFlag is a repeatable flag.
type listFlag []string

func (f *listFlag) String() string { return strings.Join(*f, ",") }

func (f *listFlag) Set(v string) error {
	if !filepath.IsAbs(v) {
		return fmt.Errorf("want an absolute path, got %q", v)
	}
	*f = append(*f, filepath.Clean(v))
	return nil
}

func (f imageFlag) String() string { return fmt.Sprint(map[string][]string(f)) }

func (f imageFlag) Set(v string) error {
	name, command, ok := strings.Cut(v, "=")
	if !ok || name == "" || strings.TrimSpace(command) == "" {
		return fmt.Errorf("want NAME=COMMAND, got %q", v)
	}
	f[name] = strings.Fields(command)
	return nil
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == initArg {
		containerInit(os.Args[2]) // never returns
	}
	endpoint := flag.String("endpoint", "", "unix:///... socket to serve the CRI on (required)")
	stateDir := flag.String("state-dir", "", "records and scratch directories (default <socket dir>/fake-cri-state)")
	podCIDR := flag.String("pod-cidr", "127.0.0.0/16", "loopback range that pod IPs come from")
	path := flag.String("path", "", "PATH of the containers, used to find their commands (default: this process's PATH)")
	images := imageFlag{}
	flag.Var(images, "image", "NAME=COMMAND: the entrypoint of an image (repository, or its last path component) when the pod gives no command; repeatable")
	var imageDirs listFlag
	flag.Var(&imageDirs, "image-dir", "DIR: a host directory that is part of every image (the installation containers run); kept visible under pod volumes mounted over its ancestors; repeatable")
	ignoreUser := flag.Bool("ignore-run-as-user", false, "run every container as root, whatever runAsUser/runAsGroup say (they are still recorded)")
	flag.Parse()
	if *endpoint == "" || !strings.HasPrefix(*endpoint, "unix://") {
		fmt.Fprintln(os.Stderr, "fake-cri: --endpoint unix:///path is required")
		os.Exit(2)
	}
	socket := strings.TrimPrefix(*endpoint, "unix://")
	if *stateDir == "" {
		*stateDir = filepath.Join(filepath.Dir(socket), "fake-cri-state")
	}
	if *path == "" {
		*path = os.Getenv("PATH")
		if *path == "" {
			*path = defaultPath
		}
	}
	ips, err := newIPPool(*podCIDR)
	if err != nil {
		fatal(err)
	}
	rt, err := newRuntime(options{stateDir: *stateDir, path: *path, images: images, imageDirs: imageDirs, ignoreUser: *ignoreUser}, ips)
	if err != nil {
		fatal(err)
	}

	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		fatal(err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		fatal(err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, rt)
	runtimeapi.RegisterImageServiceServer(server, &imageService{rt: rt})
	served := make(chan error, 1)
	go func() { served <- server.Serve(lis) }()
	logf("serving %s; state %s; pod IPs from %s; PATH %s", *endpoint, *stateDir, *podCIDR, *path)
	fmt.Printf("ready %s\n", *endpoint)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		logf("%v: stopping", s)
	case err := <-served:
		logf("gRPC server stopped: %v", err)
	}
	server.Stop()
	rt.killAll()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fake-cri:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fake-cri: "+format+"\n", args...)
}
