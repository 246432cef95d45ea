// tensor.cpp — creation, element access, views, dtype and device conversion, printing.
#include "core/tensor.h"

#include <cstring>
#include <sstream>

#include "core/backend.h"
#include "core/convert.h"
#include "core/cuda_memory.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace kiln {

// ---- Shape -------------------------------------------------------------------------------
Shape::Shape(std::initializer_list<int64_t> d) {
    KILN_CHECK(int(d.size()) <= kMaxDims, "a shape has at most ", kMaxDims, " dims, got ", d.size());
    for (int64_t v : d) dims[ndim++] = v;
}

int64_t Shape::numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= dims[i];
    return n;
}

bool Shape::operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (dims[i] != o.dims[i]) return false;
    return true;
}

std::string Shape::str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; i++) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
}

// ---- Storage -----------------------------------------------------------------------------
Storage::Storage(size_t n, Device d, Category c)
    : bytes(n), device(d), category(c), allocator(&current_allocator(d)), allocator_id(allocator->id()) {
    ptr = allocator->allocate(n, c);
    notify_allocation(ptr, int64_t(n), c, d, false);
}

Storage::~Storage() {
    notify_allocation(ptr, int64_t(bytes), category, device, true);
    Allocator::deallocate_if_alive(allocator, allocator_id, ptr);
}

// ---- creation ----------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, Category category) {
    for (int i = 0; i < shape.ndim; i++)
        KILN_CHECK(shape[i] >= 0, "Tensor::empty: negative size in shape ", shape.str());
    Tensor t;
    t.shape_ = shape;
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(t.nbytes(), device, category);
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, Category category) {
    Tensor t = empty(shape, dtype, device, category);
    if (device == Device::CPU) std::memset(t.raw(), 0, t.nbytes());
    else cuda::memset_device(t.raw(), 0, t.nbytes());
    return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device, Category category) {
    return full(shape, 1.0, dtype, device, category);
}

// Writes `value` converted to dtype (dtype.h's cast) into element i of a CPU buffer.
static void store(void* base, DType dtype, int64_t i, double value) {
    visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        static_cast<T*>(base)[i] = cast<T>(value);
    });
}

// Element i of a CPU buffer, exactly, as a double.
static double load(const void* base, DType dtype, int64_t i) {
    return visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T x = static_cast<const T*>(base)[i];
        if constexpr (is_float_type<T>) return double(float(x));
        else return double(x);
    });
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device, Category category) {
    Tensor t = empty(shape, dtype, Device::CPU, category);
    int64_t n = t.numel();
    void* p = t.raw();
    for (int64_t i = 0; i < n; i++) store(p, dtype, i, value);
    return t.to(device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
    Tensor t = empty({n}, dtype, Device::CPU);
    for (int64_t i = 0; i < n; i++) store(t.raw(), dtype, i, double(i));
    return t.to(device);
}

Tensor Tensor::uniform(const Shape& shape, float low, float high, Rng& rng, Device device, Category category) {
    Tensor t = empty(shape, DType::F32, Device::CPU, category);
    float* p = t.data<float>();
    int64_t n = t.numel();
    uint64_t first = rng.take(uint64_t(n));
    parallel_for(n, 1 << 15, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) p[i] = low + (high - low) * Rng::to_unit(rng.at(first + uint64_t(i)));
    });
    return t.to(device);
}

Tensor Tensor::normal(const Shape& shape, float mean, float stddev, Rng& rng, Device device, Category category) {
    Tensor t = empty(shape, DType::F32, Device::CPU, category);
    float* p = t.data<float>();
    int64_t n = t.numel();
    uint64_t first = rng.take(2 * uint64_t(n));
    parallel_for(n, 1 << 15, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++) {
            uint64_t k = first + 2 * uint64_t(i);
            p[i] = mean + stddev * normal_from(rng.at(k), rng.at(k + 1));
        }
    });
    return t.to(device);
}

// ---- what it is --------------------------------------------------------------------------
int64_t Tensor::size(int dim) const {
    int d = dim < 0 ? dim + ndim() : dim;
    KILN_CHECK(d >= 0 && d < ndim(), "size(", dim, ") of a ", desc(), " tensor: no such dim");
    return shape_[d];
}

std::string Tensor::desc() const {
    if (!defined()) return "undefined";
    return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device_name(device());
}

void Tensor::check_typed(DType want, const char* type_name) const {
    KILN_CHECK(defined(), "data<", type_name, ">() on an undefined tensor");
    KILN_CHECK(dtype_ == want, "data<", type_name, ">() on a ", desc(), " tensor; use data<",
               dtype_name(dtype_), "'s type> or convert with .to(DType::...)");
}

// ---- element access ----------------------------------------------------------------------
int64_t Tensor::flat_index(std::initializer_list<int64_t> index) const {
    KILN_CHECK(defined(), "element access on an undefined tensor");
    KILN_CHECK(device() == Device::CPU, "element access on a ", desc(),
               " tensor: copy it to the CPU first with .to(Device::CPU)");
    KILN_CHECK(int(index.size()) == ndim(), "element access with ", index.size(), " indices on a ", desc(), " tensor");
    int64_t flat = 0;
    int d = 0;
    for (int64_t i : index) {
        KILN_CHECK(i >= 0 && i < shape_[d], "index ", i, " out of range for dim ", d, " of a ", desc(), " tensor");
        flat = flat * shape_[d] + i;
        d++;
    }
    return flat;
}

double Tensor::get(std::initializer_list<int64_t> index) const { return load(raw(), dtype_, flat_index(index)); }

void Tensor::set(std::initializer_list<int64_t> index, double value) { store(raw(), dtype_, flat_index(index), value); }

double Tensor::item() const {
    KILN_CHECK(defined(), "item() of an undefined tensor");
    KILN_CHECK(numel() == 1, "item() needs a one-element tensor, got ", desc());
    Tensor c = to(Device::CPU);
    return load(c.raw(), dtype_, 0);
}

// ---- views and copies --------------------------------------------------------------------
Tensor Tensor::reshape(const Shape& shape) const {
    KILN_CHECK(defined(), "reshape of an undefined tensor");
    Shape s = shape;
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < s.ndim; i++) {
        if (s.dims[i] == -1) {
            KILN_CHECK(infer < 0, "reshape to ", shape.str(), ": only one dim may be -1");
            infer = i;
        } else {
            known *= s.dims[i];
        }
    }
    if (infer >= 0) {
        KILN_CHECK(known > 0 && numel() % known == 0, "reshape of ", desc(), " to ", shape.str(), ": ", numel(),
                   " elements do not divide into that shape");
        s.dims[infer] = numel() / known;
    }
    KILN_CHECK(s.numel() == numel(), "reshape of ", desc(), " to ", shape.str(), ": ", numel(), " elements vs ",
               s.numel());
    Tensor t = *this;
    t.shape_ = s;
    return t;
}

Tensor Tensor::view(size_t byte_offset, const Shape& shape) const {
    KILN_CHECK(defined(), "view of an undefined tensor");
    Tensor t = *this;
    t.shape_ = shape;
    t.offset_ = offset_ + byte_offset;
    KILN_CHECK(byte_offset + t.nbytes() <= nbytes(), "view ", dtype_name(dtype_), shape.str(), " at byte ",
               byte_offset, " of a ", desc(), " tensor (", nbytes(), " bytes): it does not fit");
    return t;
}

Tensor Tensor::clone() const {
    Tensor t = empty(shape_, dtype_, device(), category());
    t.copy_from(*this);
    return t;
}

void Tensor::copy_from(const Tensor& src) {
    KILN_CHECK(defined() && src.defined(), "copy_from with an undefined tensor");
    KILN_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: ", src.desc(), " into ", desc(),
               " (shapes and dtypes must match; convert with .to(dtype))");
    size_t n = nbytes();
    if (n == 0) return;
    if (device() == Device::CPU && src.device() == Device::CPU) std::memcpy(raw(), src.raw(), n);
    else if (device() == Device::CUDA && src.device() == Device::CPU) cuda::copy_to_device(raw(), src.raw(), n);
    else if (device() == Device::CPU) cuda::copy_to_host(raw(), src.raw(), n);
    else cuda::copy_device_to_device(raw(), src.raw(), n);
}

Tensor Tensor::to(DType dt) const {
    if (!defined() || dt == dtype_) return *this;
    Tensor t = empty(shape_, dt, device(), category());
    convert_into(*this, t);
    return t;
}

void convert_into(const Tensor& src, Tensor& dst) {
    KILN_CHECK(src.shape() == dst.shape() && src.device() == dst.device(), "convert_into: ", src.desc(), " into ",
               dst.desc(), ": the shapes and devices must match");
    on_backend(src.device(), [&](auto be) {
        visit_dtype(src.dtype(), [&](auto from) {
            visit_dtype(dst.dtype(), [&](auto to) {
                kernel::convert(be, src.data<decltype(from)>(), dst.data<decltype(to)>(), src.numel());
            });
        });
    });
}

Tensor Tensor::to(Device d) const {
    if (!defined() || d == device()) return *this;
    Tensor t = empty(shape_, dtype_, d, category());
    t.copy_from(*this);
    return t;
}

// ---- slabs ------------------------------------------------------------------------------
// offset_i = round_up(offset_{i-1} + bytes_{i-1}, kAlign); the slab is zeroed, padding included.
Slab make_slab(const std::vector<Shape>& shapes, DType dtype, Device device, Category category) {
    std::vector<size_t> offsets;
    size_t end = 0;
    for (const Shape& s : shapes) {
        const size_t at = (end + Slab::kAlign - 1) / Slab::kAlign * Slab::kAlign;
        offsets.push_back(at);
        end = at + size_t(s.numel()) * dtype_size(dtype);
    }
    Slab slab;
    slab.whole = Tensor::zeros({int64_t(end / dtype_size(dtype))}, dtype, device, category);
    for (size_t i = 0; i < shapes.size(); i++) slab.views.push_back(slab.whole.view(offsets[i], shapes[i]));
    return slab;
}

// ---- printing ----------------------------------------------------------------------------
static void print_dim(std::ostream& os, const Tensor& t, const void* base, int dim, int64_t offset, int max_per_dim,
                      int indent) {
    int64_t n = t.shape()[dim];
    int64_t inner = 1;
    for (int d = dim + 1; d < t.ndim(); d++) inner *= t.shape()[d];
    os << "[";
    for (int64_t i = 0; i < n; i++) {
        if (n > max_per_dim && i == max_per_dim / 2) {  // elide the middle
            os << "...";
            i = n - max_per_dim / 2 - 1;
            os << (dim + 1 == t.ndim() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
            continue;
        }
        if (dim + 1 == t.ndim()) os << load(base, t.dtype(), offset + i);
        else print_dim(os, t, base, dim + 1, offset + i * inner, max_per_dim, indent + 1);
        if (i + 1 < n) os << (dim + 1 == t.ndim() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
    }
    os << "]";
}

std::string Tensor::str(int max_per_dim) const {
    std::ostringstream os;
    os << "tensor " << desc();
    if (!defined()) return os.str();
    Tensor c = to(Device::CPU);
    os << "\n";
    if (ndim() == 0) os << load(c.raw(), dtype_, 0);
    else print_dim(os, c, c.raw(), 0, 0, max_per_dim < 2 ? 2 : max_per_dim, 0);
    return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- argument checks ---------------------------------------------------------------------
void check_defined(const Tensor& t, const char* op, const char* arg) {
    KILN_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_shape(const Tensor& t, const Shape& want, const char* op, const char* arg) {
    check_defined(t, op, arg);
    KILN_CHECK(t.shape() == want, op, ": '", arg, "' should have shape ", want.str(), " but is ", t.desc());
}

void check_dtype(const Tensor& t, DType want, const char* op, const char* arg) {
    check_defined(t, op, arg);
    KILN_CHECK(t.dtype() == want, op, ": '", arg, "' should be ", dtype_name(want), " but is ", t.desc());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
    KILN_CHECK(a.device() == b.device(), op, ": tensors on different devices (", a.desc(), " and ", b.desc(),
               "); move one with .to(Device::...)");
}

}  // namespace kiln
