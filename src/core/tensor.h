// tensor.h — kiln's n-dimensional array: a shape, a dtype, a device, and bytes from an allocator.
//
//   Tensor x = Tensor::zeros({64, 1, 28, 28});          // N, C, H, W   f32 on the CPU
//   float* p = x.data<float>();                         // contiguous, row-major
//   Tensor flat = x.reshape({64, -1});                  // a view: same bytes, new shape
//   Tensor h = x.to(DType::F16);                        // a copy, rounded to nearest even
//   Tensor w = slab.view(256, {10, 784});               // a view at a byte offset of slab's bytes
//
// Tensors are contiguous and row-major (NCHW for images) with up to 5 dimensions. Copying a
// Tensor object copies a reference: both see the same bytes (like a PyTorch tensor); clone()
// copies the bytes. The bytes come from current_allocator(device) at creation, tagged with a
// Category, and go back to it when the last reference dies.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace kiln {

class Rng;

struct Shape {
    static constexpr int kMaxDims = 5;
    int64_t dims[kMaxDims] = {0, 0, 0, 0, 0};
    int ndim = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> d);
    int64_t operator[](int i) const { return dims[i]; }
    int64_t numel() const;
    bool operator==(const Shape& o) const;
    bool operator!=(const Shape& o) const { return !(*this == o); }
    std::string str() const;  // "[64, 1, 28, 28]"
};

// The bytes behind one or more tensors; returned to its allocator when the last one dies
// (if that allocator still exists: see Allocator::deallocate_if_alive).
struct Storage {
    void* ptr = nullptr;
    size_t bytes = 0;
    Device device = Device::CPU;
    Category category = Category::Other;
    Allocator* allocator = nullptr;
    uint64_t allocator_id = 0;
    Storage(size_t bytes, Device device, Category category);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
};

class Tensor {
public:
    Tensor() = default;  // an undefined tensor: defined() is false

    // ---- creation ---------------------------------------------------------------------
    static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                        Category category = Category::Other);
    static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                        Category category = Category::Other);
    static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                       Category category = Category::Other);
    static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                       Device device = Device::CPU, Category category = Category::Other);
    static Tensor arange(int64_t n, DType dtype = DType::F32, Device device = Device::CPU);
    // Seeded, counter-based: the same rng state gives the same values on any thread count.
    static Tensor uniform(const Shape& shape, float low, float high, Rng& rng,
                          Device device = Device::CPU, Category category = Category::Other);
    static Tensor normal(const Shape& shape, float mean, float stddev, Rng& rng,
                         Device device = Device::CPU, Category category = Category::Other);

    // ---- what it is -------------------------------------------------------------------
    bool defined() const { return storage_ != nullptr; }
    const Shape& shape() const { return shape_; }
    int ndim() const { return shape_.ndim; }
    int64_t size(int dim) const;  // negative dims count from the end
    int64_t numel() const { return shape_.numel(); }
    DType dtype() const { return dtype_; }
    Device device() const { return storage_ ? storage_->device : Device::CPU; }
    Category category() const { return storage_ ? storage_->category : Category::Other; }
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
    std::string desc() const;  // "f32[64, 10] on cpu"

    // ---- the bytes --------------------------------------------------------------------
    // Typed pointer to the first element (a device pointer for CUDA tensors). Checks that T
    // is the dtype's C++ type: float, f16, bf16, int8_t, int32_t or uint8_t (dtype.h).
    template <typename T> T* data();
    template <typename T> const T* data() const;
    void* raw() { return storage_ ? static_cast<char*>(storage_->ptr) + offset_ : nullptr; }
    const void* raw() const { return storage_ ? static_cast<const char*>(storage_->ptr) + offset_ : nullptr; }
    // Where the tensor's bytes start inside its storage (0 unless it is a view made by view()).
    size_t offset() const { return offset_; }
    // Does `other` read the same storage (its bytes or a view of them)?
    bool shares_storage(const Tensor& other) const { return storage_ && storage_ == other.storage_; }

    // Element access with bounds checks, any dtype, read/written as double (CPU only).
    double get(std::initializer_list<int64_t> index) const;
    void set(std::initializer_list<int64_t> index, double value);
    double item() const;  // the value of a one-element tensor

    // ---- views and copies -------------------------------------------------------------
    Tensor reshape(const Shape& shape) const;  // one dim may be -1; shares the bytes
    // A tensor of `shape` (this dtype) over this tensor's bytes from `byte_offset` on: shares
    // the storage, like reshape. It must fit inside this tensor's bytes.
    Tensor view(size_t byte_offset, const Shape& shape) const;
    Tensor clone() const;  // a copy of this tensor's bytes only
    // Converts on the tensor's device (dtype.h's cast: floats round to nearest even; integers
    // round to nearest even and saturate, NaN -> 0); returns *this if already that dtype.
    Tensor to(DType dtype) const;  // a copy converted by the conversion kernel (core/convert.h)
    Tensor to(Device device) const;            // copies between devices; *this if already there
    void copy_from(const Tensor& src);         // same shape and dtype, any devices

    // ---- printing ---------------------------------------------------------------------
    // "tensor f32[2, 3] on cpu\n[[0, 1, 2],\n [3, 4, 5]]"; long dims are elided with "...".
    std::string str(int max_per_dim = 6) const;

private:
    std::shared_ptr<Storage> storage_;
    size_t offset_ = 0;  // bytes from storage_->ptr to the first element
    Shape shape_;
    DType dtype_ = DType::F32;

    int64_t flat_index(std::initializer_list<int64_t> index) const;
    void check_typed(DType want, const char* type_name) const;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// dst = src in dst's element type (what Tensor::to(DType) runs): one conversion kernel per pair of
// C++ types (core/convert.h), on the tensors' device — a CUDA tensor is converted on the GPU,
// never through the host. The shapes and devices must match.
void convert_into(const Tensor& src, Tensor& dst);

// ---- slabs ------------------------------------------------------------------------------------
// One allocation holding many tensors (llm.c's parameter slab): `whole` is the flat 1-D tensor
// of all its bytes, `views` one tensor per shape, in order, each starting at a multiple of
// kSlabAlign bytes (the allocator's alignment, so a view is aligned like any tensor). The
// padding between views is zero.
struct Slab {
    static constexpr size_t kAlign = 256;
    Tensor whole;
    std::vector<Tensor> views;
};
Slab make_slab(const std::vector<Shape>& shapes, DType dtype, Device device, Category category);

// ---- argument checks that every op uses ---------------------------------------------------
// Each names the operation and the tensors so the message says what to fix.
void check_defined(const Tensor& t, const char* op, const char* arg);
void check_shape(const Tensor& t, const Shape& want, const char* op, const char* arg);
void check_dtype(const Tensor& t, DType want, const char* op, const char* arg);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);

template <typename T> T* Tensor::data() {
    check_typed(dtype_of<T>::value, dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw());
}

template <typename T> const T* Tensor::data() const { return const_cast<Tensor*>(this)->data<T>(); }

}  // namespace kiln
