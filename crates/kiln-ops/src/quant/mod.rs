//! Family module: quantization ops: `QuantizeLinear`, `DequantizeLinear`,
//! `DynamicQuantizeLinear`, `MatMulInteger`, `ConvInteger`, `QLinearMatMul`, `QLinearConv`, and
//! kiln's fused `QLinearAdd`.

pub mod integer;
pub mod linear;
pub(crate) mod qadd;
mod qconv;

pub use integer::{
    AutoPad, ConvAttrs, ConvInteger, GroupsPackCache, MatMulInteger, PackCache, QLinearConv, QLinearMatMul, TapsCache,
};
pub use linear::{DequantizeLinear, DynamicQuantizeLinear, QuantizeLinear};
pub use qadd::QLinearAdd;

op_family! {
    /// The quantization family.
    pub enum QuantOp {
        QuantizeLinear(QuantizeLinear),
        DequantizeLinear(DequantizeLinear),
        DynamicQuantizeLinear(DynamicQuantizeLinear),
        MatMulInteger(MatMulInteger),
        ConvInteger(ConvInteger),
        QLinearMatMul(QLinearMatMul),
        QLinearConv(QLinearConv),
        QLinearAdd(QLinearAdd),
    }
}
