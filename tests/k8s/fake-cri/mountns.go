package main

// The container-side helper: the runtime starts "/proc/self/exe __fake-cri-container-init
// <record>" in a fresh mount namespace (and UTS namespace unless the pod uses the host network).
// The helper builds the container's view of the filesystem, chroots into it, takes the
// container's user and execs the container's command. It reports a setup error on fd 3, which is
// close-on-exec, so a successful exec reads as an empty, closed pipe to the runtime.
//
// The view, all of it inside the private namespace:
//  1. a tmpfs on <state>/containers/<id>/scratch (on the host that stays an empty directory);
//  2. scratch/root: the host's root, bound recursively;
//  3. every CRI mount bound (recursively) at its container path under scratch/root, shallow paths
//     first, then remounted read-only when asked; an image directory that such a mount covers is
//     bound again at its own path, in the same depth order; then every device;
//  4. chroot(scratch/root), chdir(working dir).
//
// A mount point that does not exist is never created on the host: the nearest existing parent
// directory is "shadowed", i.e. replaced by a directory on the scratch tmpfs that holds a bind
// mount of each original entry (symlinks are copied), and the missing directories or file are
// created there. Paths are resolved inside the new root, so symlinks such as /var/run -> /run lead
// to the same place as they would in the container.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

func containerInit(recordPath string) {
	report := os.NewFile(3, "sync")
	syscall.CloseOnExec(3)
	err := setupAndExec(recordPath)
	// Only reached when something failed.
	fmt.Fprintf(report, "%v", err)
	os.Exit(127)
}

func setupAndExec(recordPath string) error {
	data, err := os.ReadFile(recordPath)
	if err != nil {
		return err
	}
	var spec initSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", recordPath, err)
	}
	// Nothing mounted here may propagate back to the node (Go already did this on unshare).
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	if err := syscall.Mount("tmpfs", spec.Scratch, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", spec.Scratch, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(spec.Scratch, &st); err != nil {
		return err
	}
	v := &view{root: filepath.Join(spec.Scratch, "root"), scratch: spec.Scratch, scratchDev: st.Dev}
	if err := os.Mkdir(v.root, 0o755); err != nil {
		return err
	}
	if err := bind("/", v.root); err != nil {
		return err
	}

	mounts := append([]mountSpec(nil), spec.Mounts...)
	for _, dir := range spec.ImageDirs {
		if coveredByMount(dir, spec.Mounts) {
			mounts = append(mounts, mountSpec{HostPath: dir, ContainerPath: dir})
		}
	}
	sort.SliceStable(mounts, func(i, j int) bool { return depth(mounts[i].ContainerPath) < depth(mounts[j].ContainerPath) })
	for _, m := range mounts {
		if err := v.mount(m); err != nil {
			return fmt.Errorf("mount %s at %s: %w", m.HostPath, m.ContainerPath, err)
		}
	}
	for _, d := range spec.Devices {
		if err := v.device(d); err != nil {
			return fmt.Errorf("device %s at %s: %w", d.HostPath, d.ContainerPath, err)
		}
	}
	wd := spec.WorkingDir
	if wd == "" {
		wd = "/"
	}
	wdPath, err := v.resolve(wd)
	if err != nil {
		return err
	}
	if err := v.ensure(wdPath, true); err != nil {
		return fmt.Errorf("working directory %s: %w", wd, err)
	}
	if err := syscall.Chdir(v.root); err != nil {
		return err
	}
	if err := syscall.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := syscall.Chdir(wd); err != nil {
		return fmt.Errorf("working directory %s: %w", wd, err)
	}
	if spec.Hostname != "" {
		if err := syscall.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	if spec.UID != nil || spec.GID != nil || len(spec.Groups) > 0 {
		groups := make([]int, len(spec.Groups))
		for i, g := range spec.Groups {
			groups[i] = int(g)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if spec.GID != nil {
			if err := syscall.Setgid(int(*spec.GID)); err != nil {
				return fmt.Errorf("setgid: %w", err)
			}
		}
		if spec.UID != nil {
			if err := syscall.Setuid(int(*spec.UID)); err != nil {
				return fmt.Errorf("setuid: %w", err)
			}
		}
	}
	path, err := lookPath(spec.Argv[0], spec.Env)
	if err != nil {
		return err
	}
	err = syscall.Exec(path, spec.Argv, spec.Env)
	return fmt.Errorf("exec %s: %w", path, err)
}

// coveredByMount says whether a CRI mount's container path is a proper ancestor of dir.
func coveredByMount(dir string, mounts []mountSpec) bool {
	for _, m := range mounts {
		at := filepath.Clean("/" + m.ContainerPath)
		if at == "/" || strings.HasPrefix(dir, at+"/") {
			return true
		}
	}
	return false
}

func depth(p string) int { return strings.Count(filepath.Clean("/"+p), "/") }

func bind(src, dst string) error {
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// lookPath finds the command on the container's PATH (we are already inside its root).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in PATH %q", name, path)
}

type view struct {
	root       string // the container's root (scratch/root)
	scratch    string
	scratchDev uint64
	shadows    int
	volumes    []string // where directory volumes are mounted (under root)
}

func (v *view) mount(m mountSpec) error {
	src, err := os.Stat(m.HostPath)
	if err != nil {
		return err
	}
	dst, err := v.resolve(m.ContainerPath)
	if err != nil {
		return err
	}
	if err := v.ensure(dst, src.IsDir()); err != nil {
		return err
	}
	if err := bind(m.HostPath, dst); err != nil {
		return err
	}
	if src.IsDir() {
		v.volumes = append(v.volumes, dst)
	}
	if m.Readonly {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", dst, "", flags, ""); err != nil {
			return fmt.Errorf("read-only remount: %w", err)
		}
	}
	return nil
}

// device binds the host's device node, or leaves an empty placeholder file when the host has none
// (a fake device plugin's /dev/iluvatar0).
func (v *view) device(d deviceSpec) error {
	dst, err := v.resolve(d.ContainerPath)
	if err != nil {
		return err
	}
	if err := v.ensure(dst, false); err != nil {
		return err
	}
	if _, err := os.Stat(d.HostPath); err != nil {
		return nil
	}
	return bind(d.HostPath, dst)
}

// resolve maps a container path to a path under the root, following symlinks inside the root
// (an absolute link target starts again at the root; ".." never leaves it).
func (v *view) resolve(p string) (string, error) {
	todo := strings.Split(filepath.Clean("/"+p), "/")
	var done []string
	for links := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		full := filepath.Join(append([]string{v.root}, append(done, c)...)...)
		fi, err := os.Lstat(full)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(full)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return filepath.Join(append([]string{v.root}, done...)...), nil
}

func (v *view) onScratch(dir string) bool {
	var st syscall.Stat_t
	return syscall.Stat(dir, &st) == nil && st.Dev == v.scratchDev
}

// ensure makes p exist (a directory, or an empty file), creating it only on the scratch tmpfs.
func (v *view) ensure(p string, dir bool) error {
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	parent := filepath.Dir(p)
	if parent == p {
		return errors.New("cannot create /")
	}
	if err := v.ensure(parent, true); err != nil {
		return err
	}
	if !v.onScratch(parent) {
		// Inside a volume a runtime creates the mount point in the volume itself, as runc does.
		if v.inVolume(parent) && create(p, dir) == nil {
			return nil
		}
		if err := v.shadow(parent); err != nil {
			return err
		}
	}
	return create(p, dir)
}

func create(p string, dir bool) error {
	if dir {
		return os.Mkdir(p, 0o755)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func (v *view) inVolume(dir string) bool {
	for _, vol := range v.volumes {
		if dir == vol || strings.HasPrefix(dir, vol+"/") {
			return true
		}
	}
	return false
}

// shadow covers dir with a scratch directory that holds a bind mount of each of dir's entries.
func (v *view) shadow(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	v.shadows++
	s := filepath.Join(v.scratch, fmt.Sprintf("shadow-%d", v.shadows))
	if err := os.Mkdir(s, 0o755); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		_ = os.Lchown(s, int(st.Uid), int(st.Gid))
	}
	if err := os.Chmod(s, fi.Mode()&fs.ModePerm|fi.Mode()&(fs.ModeSticky|fs.ModeSetgid|fs.ModeSetuid)); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(s, e.Name())
		efi, err := os.Lstat(src)
		if err != nil {
			continue // gone meanwhile
		}
		switch {
		case efi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			err = os.Symlink(target, dst)
			if err != nil {
				return err
			}
			continue
		case efi.IsDir():
			err = os.Mkdir(dst, 0o755)
		default:
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return err
		}
		if err := bind(src, dst); err != nil {
			return err
		}
	}
	return bind(s, dir)
}
