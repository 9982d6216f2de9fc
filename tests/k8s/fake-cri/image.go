package main

// The image service: an image is only a name. Pulling one remembers it; what it runs is decided by
// the container's command or by the image-name rule (entrypoint).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path"
	"sort"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type imageService struct {
	runtimeapi.UnimplementedImageServiceServer
	rt *runtime
}

// normalizeImage adds ":latest" to a name without tag or digest.
func normalizeImage(name string) string {
	if strings.Contains(name, "@") || strings.LastIndex(name, ":") > strings.LastIndex(name, "/") {
		return name
	}
	return name + ":latest"
}

// imageRepository is the name without tag and digest: "reg.example:5000/a/ix-gpu:1.0" -> "reg.example:5000/a/ix-gpu".
func imageRepository(name string) string {
	name, _, _ = strings.Cut(name, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name
}

func imageID(name string) string {
	sum := sha256.Sum256([]byte(normalizeImage(name)))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// entrypoint is what an image runs when the pod gives no command: the --image mapping for its
// repository, or for the repository's last path component, or that component itself.
func (r *runtime) entrypoint(image string) []string {
	repo := imageRepository(image)
	base := path.Base(repo)
	for _, key := range []string{image, repo, base} {
		if cmd, ok := r.opts.images[key]; ok {
			return append([]string(nil), cmd...)
		}
	}
	if base == "" || base == "." || base == "/" {
		return nil
	}
	return []string{base}
}

// imageRef is the image's ID: a pulled image has the same (containers may name images never pulled).
func (r *runtime) imageRef(name string) string { return imageID(name) }

// imageName is the name a container's image was given: the kubelet passes the pulled image's ID
// (the image ref) and, separately, the name the pod spec used. r.mu must be held.
func (r *runtime) imageName(spec *runtimeapi.ImageSpec) string {
	if name := spec.GetUserSpecifiedImage(); name != "" {
		return name
	}
	for _, img := range r.images {
		if img.Id == spec.GetImage() {
			return img.RepoTags[0]
		}
	}
	return spec.GetImage()
}

func (s *imageService) find(name string) *runtimeapi.Image {
	if img, ok := s.rt.images[normalizeImage(name)]; ok {
		return img
	}
	for _, img := range s.rt.images {
		if img.Id == name {
			return img
		}
	}
	return nil
}

func (s *imageService) ListImages(_ context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	var out []*runtimeapi.Image
	if want := req.GetFilter().GetImage().GetImage(); want != "" {
		if img := s.find(want); img != nil {
			out = append(out, img)
		}
	} else {
		for _, img := range s.rt.images {
			out = append(out, img)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RepoTags[0] < out[j].RepoTags[0] })
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

func (s *imageService) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	// An image never pulled has no status (nil image, no error): the kubelet then pulls it.
	return &runtimeapi.ImageStatusResponse{Image: s.find(req.GetImage().GetImage())}, nil
}

func (s *imageService) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	name := req.GetImage().GetImage()
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	img := s.find(name)
	if img == nil {
		norm := normalizeImage(name)
		img = &runtimeapi.Image{Id: imageID(name), RepoTags: []string{norm}, Size: 1, Spec: &runtimeapi.ImageSpec{Image: norm}}
		s.rt.images[norm] = img
		logf("PullImage %s -> %.19s", name, img.Id)
	}
	return &runtimeapi.PullImageResponse{ImageRef: img.Id}, nil
}

func (s *imageService) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	if img := s.find(req.GetImage().GetImage()); img != nil {
		delete(s.rt.images, img.RepoTags[0])
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

func (s *imageService) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	usage := func() []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: s.rt.opts.stateDir},
			UsedBytes:  &runtimeapi.UInt64Value{Value: 0},
			InodesUsed: &runtimeapi.UInt64Value{Value: 0},
		}}
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: usage(), ContainerFilesystems: usage()}, nil
}
