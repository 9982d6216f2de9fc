// Command fake-cri serves the fake container runtime of k8s.io/cri-client/pkg/fake (runtime and
// image services, no real containers) on a unix socket, so that a real kubelet can run against it.
//
//	fake-cri --endpoint unix:///path/to/cri.sock
//
// It reports the runtime and network as ready and cgroupfs as the cgroup driver, prints
// "ready <endpoint>" on stdout once the socket is served, and stops on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix:///... socket to serve the CRI on")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "fake-cri: --endpoint is required")
		os.Exit(2)
	}
	rt := fake.NewFakeRemoteRuntime()
	rt.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	if err := rt.Start(*endpoint); err != nil {
		fmt.Fprintln(os.Stderr, "fake-cri:", err)
		os.Exit(1)
	}
	fmt.Printf("ready %s\n", *endpoint)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	rt.Stop()
}
