package integration

import (
	"archive/tar"
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	ajclient "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/testenv"
)

// bulkLayer is a layer of n files of about size bytes each, of text-like
// content (it compresses about as well as a distribution's files).
func bulkLayer(b *testing.B, seed uint64, n, size int) v1.Layer {
	r := rand.New(rand.NewPCG(seed, 1))
	words := strings.Fields("the of and to in is for on with as by at from this that be are or an it not data file value error return func type struct package import config layer image jail agent")
	entries := []imagetest.Entry{{Name: fmt.Sprintf("data%d/", seed), Type: tar.TypeDir}}
	for i := range n {
		var sb strings.Builder
		for sb.Len() < size {
			sb.WriteString(words[r.IntN(len(words))])
			if r.IntN(12) == 0 {
				fmt.Fprintf(&sb, " %x\n", r.Uint64())
			} else {
				sb.WriteByte(' ')
			}
		}
		entries = append(entries, imagetest.Entry{Name: fmt.Sprintf("data%d/f%05d.txt", seed, i), Body: sb.String()})
	}
	return imagetest.Layer(b, entries...)
}

// BenchmarkImageCreateToFirstExec times create → first exec of a jail of
// an image whose layers are pulled, against the same for a host jail
// (both miss the warm pool). Target: ≤ 1.2× the host jail.
func BenchmarkImageCreateToFirstExec(b *testing.B) {
	bb := testenv.RequireTool(b, "busybox")
	reg := imagetest.NewRegistry(b)
	d := newDaemon(b, "--insecure-registry", reg.Host)
	ref := reg.Push(b, "bench/busybox:1", imagetest.Image(b, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Layer(b, imagetest.Busybox(b, bb)...)))
	c := ajclient.New(d.addr, d.token)
	if _, err := c.Pull(context.Background(), ref, nil); err != nil {
		b.Fatal(err)
	}
	createExec := func(spec map[string]any) time.Duration {
		start := time.Now()
		var j jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails", spec, &j)
		res := d.exec(b, j.ID, execReq{Cmd: []string{"echo", "hi"}})
		took := time.Since(start)
		if res.Stdout != "hi\n" {
			b.Fatalf("exec: %s", &res)
		}
		b.StopTimer()
		d.destroy(b, j.ID)
		b.StartTimer()
		return took
	}
	var ours, ref2 []time.Duration
	b.ResetTimer()
	for range b.N {
		ours = append(ours, createExec(map[string]any{"name": uniqueName(b), "isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + ref}}}))
		ref2 = append(ref2, createExec(map[string]any{"name": uniqueName(b)}))
	}
	b.StopTimer()
	mo, mr := median(ours), median(ref2)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(1.2, "target-x")
}

// BenchmarkImagePullUnpack times a pull of an image of three 20 MiB layers
// through the daemon (download over loopback, verification, unpack into
// the layer store) against `tar -xzf` of the same layer blobs, one after
// the other, and against skopeo copy + umoci unpack where those are
// installed. Target: the pull at least as fast as tar (≤ 1×).
func BenchmarkImagePullUnpack(b *testing.B) {
	reg := imagetest.NewRegistry(b)
	d := newDaemon(b, "--insecure-registry", reg.Host)
	c := ajclient.New(d.addr, d.token)
	var layers []v1.Layer
	for i := range 3 {
		layers = append(layers, bulkLayer(b, uint64(i+1), 1000, 20<<10))
	}
	img := imagetest.Image(b, v1.Config{}, layers...)
	ref := reg.Push(b, "bench/bulk:1", img)
	blobDir := b.TempDir()
	var blobs []string
	var unpacked int64
	for i, l := range layers {
		p := filepath.Join(blobDir, fmt.Sprintf("layer%d.tar.gz", i))
		if err := os.WriteFile(p, imagetest.Blob(b, l), 0o644); err != nil {
			b.Fatal(err)
		}
		blobs = append(blobs, p)
		unpacked += 1000 * 20 << 10
	}
	skopeo, _ := exec.LookPath("skopeo")
	umoci, _ := exec.LookPath("umoci")
	var ours, tarRef, oci []time.Duration
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := c.Pull(ctx, ref, nil); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(start))
		b.StopTimer()
		if _, err := c.RemoveImage(ctx, ref, false); err != nil {
			b.Fatal(err)
		}
		if _, err := c.PruneImages(ctx, false); err != nil {
			b.Fatal(err)
		}
		dst := b.TempDir()
		b.StartTimer()
		start = time.Now()
		for _, blob := range blobs {
			if out, err := exec.Command("tar", "-xzf", blob, "-C", dst).CombinedOutput(); err != nil {
				b.Fatalf("tar: %v\n%s", err, out)
			}
		}
		tarRef = append(tarRef, time.Since(start))
		if skopeo != "" && umoci != "" {
			work := b.TempDir()
			start = time.Now()
			if out, err := exec.Command(skopeo, "copy", "--quiet", "--src-tls-verify=false", "docker://"+ref, "oci:"+filepath.Join(work, "oci")+":bench").CombinedOutput(); err != nil {
				b.Fatalf("skopeo copy: %v\n%s", err, out)
			}
			if out, err := exec.Command(umoci, "unpack", "--image", filepath.Join(work, "oci")+":bench", filepath.Join(work, "bundle")).CombinedOutput(); err != nil {
				b.Fatalf("umoci unpack: %v\n%s", err, out)
			}
			oci = append(oci, time.Since(start))
		}
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
	b.StopTimer()
	mo, mr := median(ours), median(tarRef)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(1.0, "target-x")
	b.ReportMetric(float64(unpacked)/(1<<20)/mo.Seconds(), "pull-MiB/s")
	b.ReportMetric(float64(unpacked)/(1<<20)/mr.Seconds(), "tar-MiB/s")
	if len(oci) > 0 {
		b.ReportMetric(ms(median(oci)), "skopeo+umoci-ms")
	}
}

// BenchmarkImage20JailsDisk starts 20 jails of one image and reports the
// disk they take: the image store's growth (the layers, once) against one
// copy of the layers unpacked by tar, and the jails' own layers. Target:
// one copy of the layers (layer-copies ≈ 1).
func BenchmarkImage20JailsDisk(b *testing.B) {
	bb := testenv.RequireTool(b, "busybox")
	reg := imagetest.NewRegistry(b)
	d := newDaemon(b, "--insecure-registry", reg.Host)
	c := ajclient.New(d.addr, d.token)
	ctx := context.Background()
	layers := []v1.Layer{imagetest.Layer(b, imagetest.Busybox(b, bb)...), bulkLayer(b, 7, 1000, 20<<10)}
	ref := reg.Push(b, "bench/disk:1", imagetest.Image(b, v1.Config{Env: []string{"PATH=/bin"}}, layers...))
	// One copy of the layers on disk, as tar unpacks them.
	var oneCopy int64
	for _, l := range layers {
		dir := b.TempDir()
		blob := filepath.Join(dir, "blob")
		if err := os.WriteFile(blob, imagetest.Blob(b, l), 0o644); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command("tar", "-xzf", blob, "-C", dir).CombinedOutput(); err != nil {
			b.Fatalf("tar: %v\n%s", err, out)
		}
		n, err := treeBytes(dir)
		if err != nil {
			b.Fatal(err)
		}
		fi, _ := os.Stat(blob)
		oneCopy += n - fi.Size()
	}
	_, before, err := c.Images(ctx)
	if err != nil {
		b.Fatal(err)
	}
	img, err := c.Pull(ctx, ref, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var storeGrowth, jailBytes int64
	for range b.N {
		var ids []string
		for range 20 {
			j := d.createJail(b, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + ref}}})
			ids = append(ids, j.ID)
		}
		b.StopTimer()
		_, after, err := c.Images(ctx)
		if err != nil {
			b.Fatal(err)
		}
		storeGrowth = after.DiskBytes - before.DiskBytes
		jailBytes = 0
		for _, id := range ids {
			if out := d.mustSh(b, id, "ls /data7 | wc -l"); strings.TrimSpace(out) != "1000" {
				b.Fatalf("jail %s sees %q files of the image", id, out)
			}
			n, err := treeBytes(filepath.Join(d.dir, "jails", id, "rootfs", "upper"))
			if err != nil {
				b.Fatal(err)
			}
			jailBytes += n
			d.destroy(b, id)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(img.Size)/(1<<20), "image-MiB")
	b.ReportMetric(float64(storeGrowth)/(1<<20), "store-MiB")
	b.ReportMetric(float64(oneCopy)/(1<<20), "one-copy-MiB")
	b.ReportMetric(float64(storeGrowth)/float64(oneCopy), "layer-copies")
	b.ReportMetric(float64(jailBytes)/20/(1<<10), "per-jail-upper-KiB")
}

// treeBytes sums the allocated blocks of the files below dir.
func treeBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
