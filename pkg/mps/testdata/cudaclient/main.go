// Command cudaclient is a CUDA client for TestRealMPSClientLimits that needs
// no CUDA toolkit: it dlopen()s the driver's libcuda.so.1 and calls the
// driver API through function pointers declared here. It allocates device
// memory (each size in -alloc, in MiB, in order), holds what it got, then
// writes every allocation and reads its last byte back, frees it and exits.
// One line per step, with the CUresult:
//
//	alloc 2048MiB: result=2 (CUDA_ERROR_OUT_OF_MEMORY)
//
// It exits 0 unless a step other than an allocation failed (an allocation
// that fails is what the test looks for). Under testdata, so that neither
// go build ./... nor go vet ./... builds it (it needs cgo); build it with
//
//	CGO_ENABLED=1 go build ./pkg/mps/testdata/cudaclient
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *open_cuda(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL); }
static void *sym(void *h, const char *name) { return dlsym(h, name); }
static const char *dl_error(void) { const char *e = dlerror(); return e ? e : ""; }

static CUresult call_init(void *f, unsigned int flags) { return ((CUresult (*)(unsigned int))f)(flags); }
static CUresult call_device_get(void *f, CUdevice *d, int ordinal) { return ((CUresult (*)(CUdevice *, int))f)(d, ordinal); }
static CUresult call_device_get_name(void *f, char *name, int len, CUdevice d) { return ((CUresult (*)(char *, int, CUdevice))f)(name, len, d); }
static CUresult call_primary_retain(void *f, CUcontext *c, CUdevice d) { return ((CUresult (*)(CUcontext *, CUdevice))f)(c, d); }
static CUresult call_ctx_set_current(void *f, CUcontext c) { return ((CUresult (*)(CUcontext))f)(c); }
static CUresult call_mem_get_info(void *f, size_t *free, size_t *total) { return ((CUresult (*)(size_t *, size_t *))f)(free, total); }
static CUresult call_mem_alloc(void *f, CUdeviceptr *p, size_t n) { return ((CUresult (*)(CUdeviceptr *, size_t))f)(p, n); }
static CUresult call_mem_free(void *f, CUdeviceptr p) { return ((CUresult (*)(CUdeviceptr))f)(p); }
static CUresult call_memset_d8(void *f, CUdeviceptr p, unsigned char v, size_t n) { return ((CUresult (*)(CUdeviceptr, unsigned char, size_t))f)(p, v, n); }
static CUresult call_memcpy_dtoh(void *f, void *dst, CUdeviceptr src, size_t n) { return ((CUresult (*)(void *, CUdeviceptr, size_t))f)(dst, src, n); }
static CUresult call_ctx_synchronize(void *f) { return ((CUresult (*)(void))f)(); }
static CUresult call_get_error_name(void *f, CUresult r, const char **s) { return ((CUresult (*)(CUresult, const char **))f)(r, s); }
*/
import "C"

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

const mib = 1 << 20

var (
	lib      unsafe.Pointer
	errName  unsafe.Pointer
	exitCode int
)

func fn(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	f := C.sym(lib, cname)
	if f == nil {
		fmt.Printf("dlsym %s: %s\n", name, C.GoString(C.dl_error()))
		os.Exit(2)
	}
	return f
}

// result prints one step's line; a failure of a step that must not fail
// sets the exit code.
func result(step string, r C.CUresult, must bool) bool {
	name := "?"
	var s *C.char
	if C.call_get_error_name(errName, r, &s) == 0 && s != nil {
		name = C.GoString(s)
	}
	fmt.Printf("%s: result=%d (%s)\n", step, int(r), name)
	if r != 0 && must {
		exitCode = 1
	}
	return r == 0
}

func main() {
	allocs := flag.String("alloc", "", "comma-separated sizes in MiB to allocate, in order")
	hold := flag.Duration("hold", 10*time.Second, "how long to hold the allocations before checking and freeing them")
	untilEOF := flag.Bool("until-eof", false, "end the hold early when stdin reaches EOF")
	flag.Parse()
	var sizes []int
	for f := range strings.SplitSeq(*allocs, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "bad size %q\n", f)
			os.Exit(2)
		}
		sizes = append(sizes, n)
	}

	if lib = C.open_cuda(); lib == nil {
		fmt.Printf("dlopen libcuda.so.1: %s\n", C.GoString(C.dl_error()))
		os.Exit(2)
	}
	errName = fn("cuGetErrorName")
	var (
		cuInit            = fn("cuInit")
		cuDeviceGet       = fn("cuDeviceGet")
		cuDeviceGetName   = fn("cuDeviceGetName")
		cuPrimaryRetain   = fn("cuDevicePrimaryCtxRetain")
		cuCtxSetCurrent   = fn("cuCtxSetCurrent")
		cuMemGetInfo      = fn("cuMemGetInfo_v2")
		cuMemAlloc        = fn("cuMemAlloc_v2")
		cuMemFree         = fn("cuMemFree_v2")
		cuMemsetD8        = fn("cuMemsetD8_v2")
		cuMemcpyDtoH      = fn("cuMemcpyDtoH_v2")
		cuCtxSynchronize  = fn("cuCtxSynchronize")
		dev               C.CUdevice
		ctx               C.CUcontext
		name              [256]C.char
		freeMem, totalMem C.size_t
	)
	fmt.Printf("pid %d, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q\n", os.Getpid(), os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
	if !result("cuInit", C.call_init(cuInit, 0), true) ||
		!result("cuDeviceGet 0", C.call_device_get(cuDeviceGet, &dev, 0), true) {
		os.Exit(exitCode)
	}
	if result("cuDeviceGetName", C.call_device_get_name(cuDeviceGetName, &name[0], C.int(len(name)), dev), true) {
		fmt.Printf("device 0: %s\n", C.GoString(&name[0]))
	}
	if !result("cuDevicePrimaryCtxRetain", C.call_primary_retain(cuPrimaryRetain, &ctx, dev), true) ||
		!result("cuCtxSetCurrent", C.call_ctx_set_current(cuCtxSetCurrent, ctx), true) {
		os.Exit(exitCode)
	}
	if result("cuMemGetInfo", C.call_mem_get_info(cuMemGetInfo, &freeMem, &totalMem), true) {
		fmt.Printf("memory: free %dMiB, total %dMiB\n", freeMem/mib, totalMem/mib)
	}

	type allocation struct {
		mib int
		ptr C.CUdeviceptr
	}
	var held []allocation
	for _, n := range sizes {
		var p C.CUdeviceptr
		if result(fmt.Sprintf("alloc %dMiB", n), C.call_mem_alloc(cuMemAlloc, &p, C.size_t(n)*mib), false) {
			held = append(held, allocation{n, p})
		}
	}

	fmt.Printf("holding %d allocation(s) for %s\n", len(held), *hold)
	done := time.After(*hold)
	eof := make(chan struct{})
	if *untilEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(eof)
		}()
	}
	select {
	case <-done:
		fmt.Println("hold: time up")
	case <-eof:
		fmt.Println("hold: stdin closed")
	}

	// Each allocation still works: written whole, its last byte read back.
	for _, a := range held {
		n := C.size_t(a.mib) * mib
		step := fmt.Sprintf("check %dMiB", a.mib)
		if !result(step+" memset", C.call_memset_d8(cuMemsetD8, a.ptr, 0x5a, n), true) ||
			!result(step+" synchronize", C.call_ctx_synchronize(cuCtxSynchronize), true) {
			continue
		}
		var b C.uchar
		if result(step+" read back", C.call_memcpy_dtoh(cuMemcpyDtoH, unsafe.Pointer(&b), a.ptr+C.CUdeviceptr(n-1), 1), true) {
			fmt.Printf("%s: last byte 0x%02x\n", step, int(b))
			if b != 0x5a {
				exitCode = 1
			}
		}
	}
	for _, a := range held {
		result(fmt.Sprintf("free %dMiB", a.mib), C.call_mem_free(cuMemFree, a.ptr), true)
	}
	fmt.Printf("exit %d\n", exitCode)
	os.Exit(exitCode)
}
